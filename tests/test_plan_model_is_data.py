"""A plan's model name is data: no subcommand imports the pkg.module:factory a plan file names unless the
user types it (--model) or says --trust-plan-model.  Every subcommand is walked in one subprocess with
a module on its PYTHONPATH that writes a marker file when imported."""
import json
import os
import subprocess
import sys

import pytest

from sapp import api

SCRIPT = r"""
import contextlib, io, json, sys
from sapp.commands.cli import main
plan, args_file, tmp = sys.argv[1:4]
runs = [
    ["export", plan, "--to", "megatron"], ["export", plan, "--to", "torchtitan"], ["export", plan, "--to", "deepspeed"],
    ["explain", plan], ["diff", plan, plan], ["plot", plan, "--out", tmp + "/p.svg"], ["evaluate", plan],
    ["run", plan], ["run", plan, "--model", "gpt-tiny", "--nproc", "2"],
    ["import", "--from", "megatron", args_file, "--model", "gpt-tiny", "--cluster", "a100-80g:devices=8",
     "--no-compare"],
    ["import", "--from", "deepspeed", plan, "--model", "gpt-tiny", "--cluster", "a100-80g:devices=8", "--no-compare"],
]
codes = []
for argv in runs:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    codes.append([argv[0], rc, err.getvalue()[-300:]])
print(json.dumps(codes))
"""


@pytest.fixture(scope="module")
def hostile_plan(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plan_model")
    # an eager plan: exporting it to Megatron (fused) or torchtitan re-prices, which needs the model;
    # two devices, so `run` trains it in two processes
    plan = api.search("gpt-tiny", "a100-80g:devices=2", constraints={"tp": 1, "pp": 1, "zero": 0,
                                                                        "placement": {"optimizer": "device"}})
    d = plan.to_dict()
    d["model"]["name"] = "sapp_marker_mod:make"
    path = tmp / "plan.json"
    path.write_text(json.dumps(d))
    mod = tmp / "pkg"
    mod.mkdir()
    marker = tmp / "MARKER"
    (mod / "sapp_marker_mod.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\n"
        "def make():\n    import sapp.models as m\n    return m.get('gpt-tiny', device='meta')\n")
    (tmp / "p.args").write_text("--num-layers 2 --tensor-model-parallel-size 1 --global-batch-size 64\n")
    return tmp, path, mod, marker


def test_no_subcommand_imports_the_plans_model(hostile_plan):
    tmp, path, mod, marker = hostile_plan
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, str(mod)]))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(path), str(tmp / "p.args"), str(tmp)], env=env,
                       capture_output=True, text=True, timeout=600, cwd=str(tmp))
    assert r.returncode == 0, r.stderr[-2000:]
    codes = json.loads(r.stdout.strip().splitlines()[-1])
    assert not marker.exists(), f"a subcommand imported the plan's model: {codes}"
    for cmd, rc, err in codes:
        assert "Traceback" not in err, (cmd, err)
    # export refused in one line, naming the way to go on
    exports = [c for c in codes if c[0] == "export"]
    assert any(rc == 2 and "--trust-plan-model" in err for _, rc, err in exports), exports


def test_trust_plan_model_is_the_way_in(hostile_plan):
    """The check is the flag, not a broken import: with --trust-plan-model the module is imported."""
    tmp, path, mod, marker = hostile_plan
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, str(mod)]))
    r = subprocess.run([sys.executable, "-m", "sapp.commands.cli", "export", str(path), "--to", "megatron",
                        "--trust-plan-model"], env=env, capture_output=True, text=True, timeout=300, cwd=str(tmp))
    assert marker.exists(), r.stderr[-1000:]
    marker.unlink()


@pytest.mark.parametrize("engine", ["megatron", "torchtitan", "torchtitan@0.2.2", "deepspeed"])
def test_a_name_with_newlines_never_becomes_a_line_of_the_engines_file(engine):
    """A newline in the plan's model name was copied into the exported header: Megatron's argument
    file gained a `--save` line that survives `grep -v '^#'`, torchtitan's TOML a `[checkpoint]` table (and
    torchtitan 0.3's Python file would gain a statement)."""
    from sapp.engines import export_plan
    from sapp.plan import Plan
    plan = api.search("gpt-tiny", "a100-80g:devices=8", constraints={"tp": 1, "pp": 1, "zero": 0,
                                                                    "placement": {"optimizer": "device"}})
    d = plan.to_dict()
    d["model"]["name"] = "gpt-tiny\n--save /tmp/pwned\n[pwned]\npwned_key = true\r\x1b[2J"
    text, _, _ = export_plan(Plan(d), engine, graph=api.capture_graph(__import__("sapp.models", fromlist=["get"]).get("gpt-tiny"))[0])
    for line in text.splitlines():
        assert not line.startswith(("--save", "[pwned]", "pwned_key")), line
    assert "\x1b" not in text and "\r" not in text


def test_fifos_are_refused_not_waited_on(tmp_path):
    """`sapp import` of a FIFO blocked forever in open(); `--log-json FIFO` blocked a rank until the job
    died of a misleading gloo timeout.  Both are refused in one line, nothing launched."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    r = subprocess.run([sys.executable, "-m", "sapp.commands.cli", "import", "--from", "megatron", str(fifo), "--model",
                        "gpt-tiny", "--cluster", "a100-80g:devices=8"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "FIFO" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    import sapp.models as models
    from tests.emit_workers.plans import make_plan
    make_plan(name="mlp-tiny", params=models.info("mlp-tiny")["params"], global_batch=4).save(tmp_path / "p.json")
    r = subprocess.run([sys.executable, "-m", "sapp.commands.cli", "run", str(tmp_path / "p.json"), "--model", "mlp-tiny",
                        "--log-json", str(fifo)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not a regular file" in r.stderr and "launching" not in r.stdout, r.stderr
