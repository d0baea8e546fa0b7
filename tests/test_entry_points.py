"""`sapp.search`, `sapp.emit`, `sapp.capture` stay callable after their subpackages are imported."""
import subprocess
import sys

CODE = """
import sapp
from sapp.search import shard_search          # imports the subpackage sapp/search
import sapp.emit.recipe, sapp.capture        # and the others
from sapp import models
assert callable(sapp.search) and callable(sapp.emit) and callable(sapp.capture)
assert sapp.search.shard_search is shard_search
plan = sapp.search("mlp-tiny", "cpu:gpus=2", global_batch=8)
assert plan.devices == 2
plan2 = sapp.search("mlp-tiny", "cpu:gpus=2", global_batch=8)
assert plan2.to_json() == plan.to_json()
print("ok")
"""


def test_entry_points_survive_subpackage_imports():
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().endswith("ok")
