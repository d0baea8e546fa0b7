"""`sapp run`: a searched world-2 plan for the cpu preset trains through torchrun and reports measured
vs predicted step time; bad launches are refused before any worker starts; a rank that dies ends the
job with a non-zero exit and a clear message within 30 s."""
import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAPP = [sys.executable, "-m", "sapp.commands.cli"]


def _sapp(*args, timeout=150, env=None):
    # hard timeout: a hung job fails the test instead of the CI run
    return subprocess.run(SAPP + list(args), cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


@pytest.fixture(scope="module")
def searched_plan(tmp_path_factory):
    """A plan from the real search for gpt-tiny on `cpu:gpus=2`, constrained to dp=2 (exactness of
    every parallel mode is tested in test_emit.py; here it is the launcher that matters)."""
    import sapp.models as models
    from sapp.api import search
    import sapp
    m = models.get("gpt-tiny", device="meta", dropout=0.0)
    plan = search(m, sapp.Cluster.parse("cpu:gpus=2"), global_batch=8, constraints={"dp": 2})
    path = tmp_path_factory.mktemp("run") / "plan.json"
    plan.save(path)
    return path, plan


def test_sapp_run_reports_measured_vs_predicted(searched_plan, tmp_path):
    path, plan = searched_plan
    out = tmp_path / "result.json"
    p = _sapp("run", str(path), "--model", "gpt-tiny", "--model-arg", "dropout=0", "--steps", "5", "--out", str(out))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    for i in range(5):
        assert f"[rank 0] step {i} loss" in p.stdout and f"[rank 1] step {i}" not in p.stdout   # rank 0 logs steps
    assert "measured step time" in p.stdout and "predicted" in p.stdout
    res = json.loads(out.read_text())
    assert res["devices"] == 2 and res["parallel"]["dp"] == 2 and res["backend"] == "gloo"
    assert len(res["step_times_s"]) == 5 and all(t > 0 for t in res["step_times_s"])
    assert res["predicted_step_time_s"] == pytest.approx(plan.predicted["step_time_s"])
    assert res["measured_over_predicted"] == pytest.approx(res["measured_step_time_s"] / res["predicted_step_time_s"])
    assert res["losses"][-1] < res["losses"][0]          # it trains


def test_sapp_run_with_data_file(tmp_path):
    """--data: each dp rank reads its shard of the file's global batches; a one-process plan here."""
    import torch
    import sapp.models as models
    sys.path.insert(0, ROOT)
    from tests.emit_workers.plans import make_plan
    make_plan(name="mlp-tiny", params=models.info("mlp-tiny")["params"], global_batch=4).save(tmp_path / "p.json")
    g = torch.Generator().manual_seed(0)
    torch.save(((torch.randn(12, 32, generator=g),), torch.randint(0, 10, (12,), generator=g)), tmp_path / "d.pt")
    p = _sapp("run", str(tmp_path / "p.json"), "--model", "mlp-tiny", "--steps", "3", "--data", str(tmp_path / "d.pt"),
              "--out", str(tmp_path / "r.json"))
    assert p.returncode == 0, p.stderr[-3000:]
    losses = json.loads((tmp_path / "r.json").read_text())["losses"]
    assert len(losses) == 3 and len(set(losses)) == 3     # three different batches of 4 rows


def test_refused_before_launch(searched_plan, tmp_path, capsys, monkeypatch):
    """In-process (the refusal happens before any worker; a fresh interpreter per case only paid for
    importing torch): the launcher call itself is forbidden, so "before launch" is checked, not assumed."""
    from sapp.commands.cli import main

    def launched(*a, **k):
        raise AssertionError("sapp run launched workers although the plan was refused")
    monkeypatch.setattr(subprocess, "call", launched)

    def refused(*argv):
        rc = main(list(argv))
        out, err = capsys.readouterr()
        assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert "step 0" not in out and "launching" not in out
        return err
    path, _ = searched_plan
    err = refused("run", str(path), "--model", "gpt-tiny", "--nproc", "3")
    assert "plan is for 2 devices" in err and "--nproc 2" in err
    assert "search a new plan" in refused("run", str(path), "--model", "gpt-small")
    d = json.loads(path.read_text())
    d["model"]["fingerprint"] = "0000000000000000"
    (tmp_path / "other.json").write_text(json.dumps(d))
    assert "fingerprint" in refused("run", str(tmp_path / "other.json"), "--model", "gpt-tiny")


def test_dead_rank_ends_job_quickly(searched_plan):
    path, _ = searched_plan
    t0 = time.time()
    p = _sapp("run", str(path), "--model", "gpt-tiny", "--steps", "50", env={"SAPP_FAULT": "1:3"}, timeout=120)
    end = time.time()
    assert p.returncode != 0
    assert "[rank 1] SAPP_FAULT: exiting at step 3" in p.stderr
    assert "sapp run: error: training failed" in p.stderr
    # the survivor says why it stopped - unless the launcher, which watches its children, ended it
    # first (seen once under a loaded CI box); then torchrun's failure report names the signal
    assert "[rank 0] error at step 3" in p.stderr or "SIGTERM" in p.stderr or "Signal 15" in p.stderr
    died_at = float(p.stderr.split("SAPP_FAULT: exiting at step 3 at t=")[1].split()[0])
    print(f"job ended {end - died_at:.2f}s after rank 1 died")
    assert end - died_at < 30, f"job took {end - died_at:.1f}s to end after rank 1 died"
    assert "[rank 0] step 49" not in p.stdout
