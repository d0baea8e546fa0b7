import json
import subprocess
import sys

from sapp.cli import main


def test_clusters_lists_presets(capsys):
    assert main(["clusters"]) == 0
    out = capsys.readouterr().out
    for name in ("a100-80g", "h100-80g", "h200", "v100-32g", "cpu"):
        assert name in out
    assert main(["clusters", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["h200"]["device_memory"] == 141e9


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "search" in capsys.readouterr().out


def test_console_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "sapp.cli", "clusters"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "a100-80g" in r.stdout
