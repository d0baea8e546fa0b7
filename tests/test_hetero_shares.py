"""Mixed-cluster plans with hostile group shares (issue 53 item 7): a hand-edited mixed plan whose
shares do not sum to the global batch, are negative, huge, not whole numbers, do not divide a group's
devices, or differ from the batch the group's own plan was priced at, is refused in one line before
anything launches; the plan as searched launches (the launch itself stubbed: tests/test_hetero_run.py
trains it)."""
import contextlib
import io
import json

import pytest

import sapp.commands.run as run_cmd
import sapp.commands.run_hetero as run_hetero
from sapp.commands.cli import main

MODEL = "tests.emit_workers.hetero_job:factory"
CASES = {"sum-short": (11, 36), "negative": (-12, 60), "huge": (10 ** 30, 36), "float": (12.0, 36),
         "fraction": (11.5, 36.5), "string": ("12", 36), "bool": (True, 47), "null": (None, 36),
         "nondividing": (13, 35), "all-zero": (0, 0), "huge-pair": (2 ** 70, 48 - 2 ** 70),
         # whole, summing and dividing, but not what the groups were priced at (these launched)
         "other-split": (16, 32), "equal": (24, 24), "one-alone": (0, 48)}


@pytest.fixture(scope="module")
def doc():
    from sapp.api import mixed as hetero_plan
    from sapp.cluster.groups import parse
    spec = ("cpu:gpus={},peak_flops={},op_overhead=0,update_op_overhead=0,inter_latency=0,mem_bandwidth={},"
            "rng_rate=1e12")
    mc = parse(spec.format(1, "0.1GFLOP/s", "1TB/s") + "+" + spec.format(2, "0.3GFLOP/s", "3TB/s"))
    return hetero_plan.search(MODEL, mc, global_batch=48, q=4)[0]


def _run(tmp_path, monkeypatch, d):
    launched = []
    monkeypatch.setattr(run_cmd, "_launch", lambda *a, **k: launched.append(a) or 0)
    for name in dir(run_hetero):
        if name.startswith("_launch"):
            monkeypatch.setattr(run_hetero, name, lambda *a, **k: launched.append(a) or 0)
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(d))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["run", str(path), "--model", MODEL, "--steps", "1"])
        except SystemExit as e:
            rc = e.code
    return rc, err.getvalue(), launched


def test_the_searched_shares_launch(doc, tmp_path, monkeypatch):
    rc, err, launched = _run(tmp_path, monkeypatch, doc)
    assert rc == 0 and launched, err


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_shares_are_refused_in_one_line(doc, tmp_path, monkeypatch, case):
    d = json.loads(json.dumps(doc))
    for g, share in zip(d["groups"]["members"], CASES[case]):
        g["batch_share"] = share
    rc, err, launched = _run(tmp_path, monkeypatch, d)
    lines = err.strip().splitlines()
    assert rc == 2 and not launched and len(lines) == 1 and "Traceback" not in err, err
    assert len(lines[0]) < 400, lines[0]
