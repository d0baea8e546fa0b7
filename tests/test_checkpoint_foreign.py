"""A checkpoint directory with things sapp never wrote (issue 53, finding 3): retention and resume
touch only sapp's checkpoints of this job's lineage; anything else stays, named once in a warning.
One process, mlp-tiny, on disk."""
import json
import os
import shutil

import pytest

from sapp.emit.runtime import checkpoint as ck
from sapp.emit.runtime.train_state import CheckpointError
from tests.test_checkpoint import _program, _step

META = {"global_batch": 4, "data": "synthetic", "shuffle": False, "seed": 0}


def _job(d, steps, keep=1, run="A", parent=None, log=None, prog=None, names=None):
    if prog is None:
        prog, names = _program()
    c = ck.Checkpointer(str(d), keep=keep, names=names, log=log if log is not None else (lambda _m: None))
    for s in steps:
        _step(prog, s)
        c.save(prog, s, dict(META, run=run, parent=parent))
    return prog, names, c


def _listing(d):
    return sorted(n for n in os.listdir(d) if n != ".sapp-lock")


def test_unmarked_step_folders_survive_retention_named_once(tmp_path):
    """A step-N still being copied in (no marker yet), one whose marker another tool wrote, and one
    holding a file of the user's: none is deleted by three saves of keep=1, and the warning names
    each once."""
    lines = []
    prog, names, c = _job(tmp_path, (5,), log=lines.append)
    copying = tmp_path / "step-00000001"
    copying.mkdir()
    (copying / "__0_0.distcp").write_bytes(b"half copied")
    forged = tmp_path / "step-00000002"
    forged.mkdir()
    (forged / ck.MARKER).write_text(json.dumps({"step": 2, "files": {}}))      # no sapp checksum
    scratch = tmp_path / ".tmp-step-00000003"                  # a scratch name with a user's file in it
    scratch.mkdir()
    (scratch / "notes.txt").write_text("mine")
    for s in (6, 7, 8):
        _step(prog, s)
        c.save(prog, s, dict(META, run="A"))
    assert _listing(tmp_path) == [".tmp-step-00000003", "step-00000001", "step-00000002", "step-00000008"]
    assert (copying / "__0_0.distcp").read_bytes() == b"half copied" and (scratch / "notes.txt").read_text() == "mine"
    warned = [ln for ln in lines if "warning" in ln]
    assert len(warned) == 1 and "\n" not in warned[0], lines
    for n in (".tmp-step-00000003", "step-00000001", "step-00000002"):
        assert n in warned[0], warned


def test_another_jobs_checkpoints_are_not_retentions_to_delete(tmp_path):
    """Job A's checkpoints, copied in beside job B's own (B did not resume from them): B's keep=1
    deletes B's older steps only; A's stay.  A run that continues A (its parent) takes A's over."""
    other = tmp_path / "other"
    _job(other, (1, 2), keep=8, run="A")
    d = tmp_path / "d"
    prog, names, c = _job(d, (3,), run="B")
    for s in (1, 2):
        shutil.copytree(other / f"step-0000000{s}", d / f"step-0000000{s}")
    for s in (4, 5):
        _step(prog, s)
        c.save(prog, s, dict(META, run="B"))
    assert [s for s, _ in ck.committed(str(d))] == [1, 2, 5]
    # job C continues B (the newest, step 5): B's lineage, and through B's parent nothing of A
    _job(d, (6, 7), run="C", parent={"checkpoint": "step-00000005", "step": 5, "run": "B"}, prog=prog, names=names)
    assert [s for s, _ in ck.committed(str(d))] == [1, 2, 7]


def test_a_foreign_folder_in_the_way_of_a_commit_is_refused_not_replaced(tmp_path):
    prog, names, c = _job(tmp_path, (1,))
    (tmp_path / "step-00000002").mkdir()
    (tmp_path / "step-00000002" / "data.bin").write_bytes(b"x")
    _step(prog, 2)
    with pytest.raises(CheckpointError) as e:
        c.save(prog, 2, dict(META, run="A"))
    assert "sapp did not write it" in str(e.value) and "\n" not in str(e.value)
    assert (tmp_path / "step-00000002" / "data.bin").read_bytes() == b"x"
    assert [s for s, _ in ck.committed(str(tmp_path))] == [1]
    # a stale scratch folder holding a user's file is refused, never emptied
    os.mkdir(tmp_path / ".tmp-step-00000003")
    (tmp_path / ".tmp-step-00000003" / "keep.txt").write_text("k")
    _step(prog, 3)
    with pytest.raises(CheckpointError, match="holds files a save does not write"):
        c.save(prog, 3, dict(META, run="A"))
    assert (tmp_path / ".tmp-step-00000003" / "keep.txt").read_text() == "k"


def test_resume_leaves_foreign_folders_alone(tmp_path):
    _job(tmp_path, (1, 2), keep=8)
    (tmp_path / "step-00000009").mkdir()
    (tmp_path / "step-00000009" / "x").write_text("y")
    before = _listing(tmp_path)
    path, meta = ck.resume_point(str(tmp_path), log=lambda _m: None)
    assert meta["step"] == 2 and _listing(tmp_path) == before
