"""Checkpoint lineage: no run loses another run's checkpoints, or its own.

- Resuming an earlier step into the directory that holds later steps of the run that wrote it is
  refused in one line before launch (its steps would replace the other run's of the same number, and
  retention, newest by step, kept the abandoned run's later steps and deleted the step just written
  and the one resumed from; a later plain --resume then continued the abandoned run).
- --resume over a directory whose checkpoints are all damaged exits non-zero in one line and deletes
  nothing (it trained from step 0 and retention deleted the damaged step).
- Retention never deletes the checkpoint a run resumed from (another job's), nor the one just written.
- A worker restarted by torchrun resumes its own run's newest checkpoint, not its first --resume.
- Every marker records the job that wrote it (`run`) and the checkpoint that job started from."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from sapp.emit.runtime import checkpoint as ck
from sapp.emit.runtime.train_state import CheckpointError
from tests.test_checkpoint import _program, _step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_of(path):
    with open(os.path.join(path, ck.MARKER)) as f:
        return json.load(f).get("run")


def _write(tmp_path, steps, run, keep=8):
    prog, names = _program()
    c = ck.Checkpointer(str(tmp_path), keep=keep, names=names)
    for s in steps:
        _step(prog, s)
        c.save(prog, s, {"global_batch": 4, "run": run})
    return prog, names


def _flip(path):
    f = next(p for p in sorted(os.listdir(path)) if p.endswith(".distcp"))
    with open(os.path.join(path, f), "r+b") as fh:
        fh.seek(100)
        b = fh.read(1)
        fh.seek(100)
        fh.write(bytes([b[0] ^ 0xFF]))


def test_resuming_an_earlier_step_into_its_directory_is_refused(tmp_path):
    _write(tmp_path, (2, 4, 6, 8), run="A")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(CheckpointError) as e:
        ck.resume_point(str(tmp_path), str(tmp_path / "step-00000004"))
    msg = str(e.value)
    assert "holds later steps (6, 8)" in msg and "another --checkpoint-dir" in msg and "\n" not in msg
    assert sorted(os.listdir(tmp_path)) == before
    # the newest is a plain continuation; reading only (no writes here) or from another directory is fine
    assert ck.resume_point(str(tmp_path), str(tmp_path / "step-00000008"))[1]["step"] == 8
    assert ck.resume_point(str(tmp_path), str(tmp_path / "step-00000004"), writing=False)[1]["step"] == 4
    assert ck.resume_point(str(tmp_path / "new"), str(tmp_path / "step-00000004"))[1]["step"] == 4


def test_resume_with_only_damaged_checkpoints_refused_deleting_nothing(tmp_path):
    _write(tmp_path, (2, 4), run="A")
    for s in (2, 4):
        _flip(tmp_path / f"step-0000000{s}")
    with pytest.raises(CheckpointError) as e:
        ck.resume_point(str(tmp_path))
    assert "no intact checkpoint" in str(e.value) and "nothing was deleted" in str(e.value)
    assert [s for s, _ in ck.committed(str(tmp_path))] == [2, 4]
    assert ck.resume_point(str(tmp_path / "empty")) is None          # nothing yet: start from step 0


def test_retention_spares_the_resumed_checkpoint_and_the_new_one(tmp_path):
    prog, names = _write(tmp_path, (2,), run="A")
    c = ck.Checkpointer(str(tmp_path), keep=1, names=names)
    assert c.find(run="B")[1]["step"] == 2
    for s in (3, 4):
        _step(prog, s)
        c.save(prog, s, {"global_batch": 4, "run": "B"})
    # keep=1 keeps step 4; step 3 (this run's) goes, step 2 (resumed from) stays
    assert [s for s, _ in ck.committed(str(tmp_path))] == [2, 4]


def test_a_restarted_worker_resumes_its_own_runs_newest(tmp_path):
    _write(tmp_path, (2,), run="A")
    prog, names = _program()
    c = ck.Checkpointer(str(tmp_path), keep=8, names=names)
    assert c.find(str(tmp_path / "step-00000002"), run="B")[1]["step"] == 2
    for s in (3, 4):
        _step(prog, s)
        c.save(prog, s, {"global_batch": 4, "run": "B"})
    # torchrun restarts run B with its original --resume step-2: it goes on from its own step 4
    path, meta = ck.resume_point(str(tmp_path), str(tmp_path / "step-00000002"), run="B")
    assert meta["step"] == 4 and _run_of(path) == "B"
    # another run naming step 2 is refused (B's steps 3, 4 follow it)
    with pytest.raises(CheckpointError, match=r"holds later steps \(3, 4\)"):
        ck.resume_point(str(tmp_path), str(tmp_path / "step-00000002"), run="C")


def _sapp(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "sapp.commands.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))


def test_sapp_run_refuses_both_before_launch(tmp_path):
    """The two losses of a review, through `sapp run`: refused in one line, nothing launched, the
    directory unchanged."""
    import sapp.models as models
    from tests.emit_workers.plans import make_plan
    _write(tmp_path / "ck", (2, 4, 6, 8), run="A")
    plan = tmp_path / "plan.json"
    make_plan(name="mlp-tiny", params=models.info("mlp-tiny")["params"], global_batch=4).save(plan)
    before = sorted(os.listdir(tmp_path / "ck"))
    common = ["run", str(plan), "--model", "mlp-tiny", "--steps", "5", "--checkpoint-dir", str(tmp_path / "ck"),
              "--checkpoint-every", "1"]
    p = _sapp(*common, "--resume", str(tmp_path / "ck" / "step-00000004"))
    assert p.returncode == 2 and "launching" not in p.stdout, p.stdout + p.stderr
    assert "holds later steps (6, 8)" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    for s in (2, 4, 6, 8):
        _flip(tmp_path / "ck" / f"step-0000000{s}")
    p = _sapp(*common, "--resume")
    assert p.returncode == 2 and "launching" not in p.stdout, p.stdout + p.stderr
    assert "no intact checkpoint" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert sorted(os.listdir(tmp_path / "ck")) == before
    shutil.rmtree(tmp_path / "ck")
