"""Files sapp writes into a checkpoint directory never follow a planted symlink (issue 53, finding 5):
the elastic re-plan's `plans/step-N-devices-W.json`, the `plans/` folder itself, a checkpoint's
marker.  A link at the file's name is replaced by the file (the link's target is untouched); a link
on the way (a folder) is refused in one line."""
import json
import os
import subprocess
import sys

import pytest

from sapp.fileio import SymlinkError, write_atomic
from tests.elastic_nodes import DATA, ENV, GB, ROOT


def _outside(tmp_path):
    victim = tmp_path / "outside" / "victim.txt"
    victim.parent.mkdir()
    victim.write_text("precious\n")
    return victim


def test_write_atomic_replaces_a_planted_link_and_refuses_a_linked_folder(tmp_path):
    victim = _outside(tmp_path)
    d = tmp_path / "ck"
    (d / "plans").mkdir(parents=True)
    os.symlink(victim, d / "plans" / "p.json")
    write_atomic(str(d / "plans" / "p.json"), "new\n", under=str(d))
    assert victim.read_text() == "precious\n"
    assert not os.path.islink(d / "plans" / "p.json") and (d / "plans" / "p.json").read_text() == "new\n"
    assert sorted(os.listdir(d / "plans")) == ["p.json"]           # no temporary name left
    # a folder on the way that is a link: refused, nothing written where it points
    (d / "plans" / "p.json").unlink()
    (d / "plans").rmdir()
    os.symlink(victim.parent, d / "plans")
    with pytest.raises(SymlinkError) as e:
        write_atomic(str(d / "plans" / "victim.txt"), "new\n", under=str(d), make=True)
    assert "plans is a symlink" in str(e.value) and "\n" not in str(e.value)
    assert victim.read_text() == "precious\n" and os.listdir(victim.parent) == ["victim.txt"]
    # `make` creates missing folders below `under`
    (tmp_path / "ck2").mkdir()
    write_atomic(str(tmp_path / "ck2" / "a" / "b.json"), b"x", under=str(tmp_path / "ck2"), make=True)
    assert (tmp_path / "ck2" / "a" / "b.json").read_bytes() == b"x"


def test_plan_save_under_a_linked_plans_folder_is_one_line(tmp_path):
    from sapp.errors import PlanError
    from sapp.api import search
    victim = _outside(tmp_path)
    plan = search("mlp-tiny", "cpu:gpus=1", global_batch=4)
    (tmp_path / "ck").mkdir()
    os.symlink(victim.parent, tmp_path / "ck" / "plans")
    with pytest.raises(PlanError) as e:
        plan.save(str(tmp_path / "ck" / "plans" / "victim.txt"), under=str(tmp_path / "ck"))
    assert "is a symlink" in str(e.value) and "\n" not in str(e.value)
    assert victim.read_text() == "precious\n"


def test_marker_is_not_written_through_a_planted_link(tmp_path, monkeypatch):
    """A link planted at the marker's name inside the scratch folder, after DCP's files are written and
    before rank 0 commits: the marker replaces the link; the outside file is untouched."""
    from sapp.emit.runtime import checkpoint as ck
    from tests.test_checkpoint import _program, _step
    victim = _outside(tmp_path)
    d = tmp_path / "ck"

    def plant(point, rank, step=None):
        os.symlink(victim, d / f".tmp-step-{step:08d}" / ck.MARKER)
    monkeypatch.setattr(ck, "planted_hold", plant)
    prog, names = _program()
    c = ck.Checkpointer(str(d), keep=2, names=names, log=lambda _m: None)
    _step(prog, 1)
    path = c.save(prog, 1, {"global_batch": 4, "run": "A"})
    assert victim.read_text() == "precious\n"
    assert not os.path.islink(os.path.join(path, ck.MARKER)) and ck.verify(path)[0] is not None


def test_elastic_replan_never_writes_through_a_planted_plan_link(tmp_path):
    """`sapp run --elastic --nproc 1` of a 2-device plan re-plans into plans/step-00000000-devices-1.json,
    where a link to a file outside the checkpoint directory was planted: the file stays as it was, the
    plan is written in the link's place, and the run trains on it."""
    from sapp.api import search
    victim = _outside(tmp_path)
    search("gpt-tiny", "cpu:gpus=1,nodes=2", global_batch=GB, constraints={"dp": 2}).save(tmp_path / "plan.json")
    (tmp_path / "ck" / "plans").mkdir(parents=True)
    link = tmp_path / "ck" / "plans" / "step-00000000-devices-1.json"
    os.symlink(victim, link)
    p = subprocess.run([sys.executable, "-m", "sapp.commands.cli", "run", str(tmp_path / "plan.json"), "--model", "gpt-tiny",
                        "--model-arg", "dropout=0", "--data", DATA, "--steps", "2", "--nproc", "1", "--elastic",
                        "--checkpoint-dir", str(tmp_path / "ck")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert victim.read_text() == "precious\n"
    assert not os.path.islink(link) and json.loads(link.read_text())["devices"] == 1
    assert f"written to {link}" in p.stdout
