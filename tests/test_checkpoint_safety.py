"""Checkpoints and plans from others are data (issue 27): a crafted DCP .metadata never runs code, a
plan's factory spec is never imported by `sapp evaluate`; retention keeps the newest verified
checkpoint; one job per directory; the marker is checksummed and names the model and data order it
fits; symlinks refused; write failures in one line; orphans of an interrupted cleanup removed.
One process, mlp-tiny, on disk."""
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import types

import pytest
import torch

from sapp.emit.runtime import checkpoint as ck
from sapp.emit.runtime.train_state import CheckpointError, model_names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _program(**cfg):
    import sapp.models as models
    from sapp.emit import emit
    from tests.emit_workers.plans import make_plan
    torch.manual_seed(0)
    m = models.get("mlp-tiny", device="cpu", **cfg)
    names = model_names(m)
    prog = emit(m, make_plan(params=sum(p.numel() for p in m.parameters()), global_batch=4), rank=0, world=1)
    return prog, names


def _step(prog, i):
    g = torch.Generator().manual_seed(i)
    return prog.step(torch.randn(4, 32, generator=g), torch.randint(0, 10, (4,), generator=g))


def _saved(d, steps=(1,), keep=2, meta=None):
    prog, names = _program()
    c = ck.Checkpointer(str(d), keep=keep, names=names)
    for s in steps:
        _step(prog, s)
        c.save(prog, s, dict({"global_batch": 4, "data": "synthetic", "shuffle": False, "seed": 0}, **(meta or {})))
    return prog, names, c


def _reseal(path):
    """What whoever edits a checkpoint does: recompute every size and CRC and the marker's checksum."""
    mp = os.path.join(path, ck.MARKER)
    meta = json.load(open(mp))
    meta["files"] = {n: [os.path.getsize(os.path.join(path, n)), ck._crc(os.path.join(path, n))]
                     for n in meta["files"]}
    if hasattr(ck, "checksum"):
        meta["checksum"] = ck.checksum(meta)
    json.dump(meta, open(mp, "w"))


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# ---- finding 1: a crafted .metadata ------------------------------------------------------------------
def test_crafted_metadata_is_refused_and_never_runs(tmp_path, capsys):
    _saved(tmp_path / "c")
    path = str(tmp_path / "c" / "step-00000001")
    marker = tmp_path / "pwned"
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(_Payload(marker), f)
    _reseal(path)
    meta, why = ck.verify(path)
    assert meta is None and "system" in why and "never holds" in why
    lines = []
    assert ck.choose(str(tmp_path / "c"), log=lines.append) is None and len(lines) == 1
    prog, names = _program()
    with pytest.raises(CheckpointError, match="refusing it"):
        ck.Checkpointer(str(tmp_path / "c"), names=names).load(prog, path)
    # through `sapp run --resume PATH`: refused before any process starts (the launcher call is
    # forbidden), in one line; in-process: a fresh interpreter only paid for importing torch
    from tests.emit_workers.plans import make_plan
    from sapp.commands.cli import main
    import sapp.models as models

    def launched(*a, **k):
        raise AssertionError("sapp run launched workers although the checkpoint was refused")
    make_plan(name="mlp-tiny", params=models.info("mlp-tiny")["params"], global_batch=4).save(tmp_path / "p.json")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess, "call", launched)
        rc = main(["run", str(tmp_path / "p.json"), "--model", "mlp-tiny", "--resume", path])
    out, err = capsys.readouterr()
    assert rc == 2 and "Traceback" not in err and "launching" not in out, err[-2000:]
    assert len(err.strip().splitlines()) == 1 and "cannot resume from" in err
    assert not marker.exists()              # the payload never ran
    pickle.loads(pickle.dumps(_Payload(marker)))
    assert marker.exists()                  # ... and would have, unpickled plainly


def test_metadata_bytes_entries_and_outside_paths_refused(tmp_path):
    """Entries DCP reads back with torch.load(weights_only=False), and storage outside the directory."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    from sapp.emit.runtime import dcp_reader
    _saved(tmp_path / "c")
    path = str(tmp_path / "c" / "step-00000001")
    raw = open(os.path.join(path, ".metadata"), "rb").read()
    md = dcp_reader.load_metadata(raw, "x")
    md.state_dict_metadata["extra"] = BytesStorageMetadata()
    with pytest.raises(CheckpointError, match="BytesStorageMetadata, which a checkpoint's metadata never holds"):
        dcp_reader.load_metadata(pickle.dumps(md), "x")
    md = dcp_reader.load_metadata(raw, "x")
    next(iter(md.storage_data.values())).relative_path = "../../elsewhere.distcp"
    with pytest.raises(CheckpointError, match="not a plain file of the checkpoint"):
        dcp_reader.load_metadata(pickle.dumps(md), "x")


# ---- finding 2: a plan's model spec ------------------------------------------------------------------
def test_evaluate_never_imports_the_plans_model(tmp_path):
    from tests.emit_workers.plans import make_plan
    (tmp_path / "evilmod.py").write_text(f"open({str(tmp_path / 'pwned')!r}, 'w').close()\ndef build(): pass\n")
    for spec in ("evilmod:build", "http.server:test"):
        make_plan(name=spec).save(tmp_path / "plan.json")
        p = subprocess.run([sys.executable, "-m", "sapp.commands.cli", "evaluate", "plan.json", "--cluster", "cpu:gpus=1"],
                           cwd=tmp_path, env=ENV,
                           capture_output=True, text=True, timeout=120)
        assert not (tmp_path / "pwned").exists()
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr[-2000:]
        assert "code that would be imported and run" in p.stderr and "--trust-plan-model" in p.stderr
    assert not (tmp_path / "pwned").exists()
    from sapp.commands._model import model_spec
    args = types.SimpleNamespace(model=None, hf_config=None, trust_plan_model=False)
    assert model_spec(args, default="gpt-tiny") == "gpt-tiny"           # zoo names and HF configs are data
    assert model_spec(args, default="cfg/config.json") == "cfg/config.json"
    assert model_spec(types.SimpleNamespace(model="evilmod:build", hf_config=None), default="x:y") == "evilmod:build"
    assert model_spec(types.SimpleNamespace(model=None, hf_config=None, trust_plan_model=True), default="a:b") == "a:b"


# ---- finding 3: retention ------------------------------------------------------------------------------
def test_retention_counts_only_verified_checkpoints(tmp_path):
    prog, names, c = _saved(tmp_path, steps=(1, 2), keep=1)
    shutil.copytree(tmp_path / "step-00000002", tmp_path / "step-00000009")      # damaged: its marker says 2
    assert ck.verify(str(tmp_path / "step-00000009"))[0] is None
    _step(prog, 3)
    c.save(prog, 3, {"global_batch": 4})
    assert [s for s, _ in ck.committed(str(tmp_path))] == [3, 9]       # the fresh one kept, 2 deleted
    assert ck.choose(str(tmp_path), log=lambda s: None)[0].endswith("step-00000003")


# ---- finding 6: one job per directory -------------------------------------------------------------------
def test_second_job_on_a_directory_refused(tmp_path):
    _, names = _program()
    first = ck.Checkpointer(str(tmp_path), names=names)
    first.check(0, resuming=False)
    code = ("import sys; from sapp.emit.runtime import checkpoint as ck\n"
            "try: ck.lock(sys.argv[1])\nexcept ck.CheckpointError as e: print(e); sys.exit(2)")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=ENV, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and f"is in use by another job (pid {os.getpid()} on" in p.stdout, p.stdout + p.stderr
    os.close(first._lock)                  # the job ended: the directory is free again
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=ENV, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


# ---- finding 7: marker, model identity, data order, symlinks, orphans -----------------------------------
def _resume(prog, names, d, partial=False, **run):
    from sapp.emit.runtime.worker import _resume as resume
    args = types.SimpleNamespace(resume="latest", checkpoint_dir=str(d), resume_partial=partial,
                                 **dict(dict(data=None, shuffle=False, seed=0), **run))
    lines = []
    start, _ = resume(args, ck.Checkpointer(str(d), names=names), prog, 4, lines.append)
    return start, lines


def test_edited_marker_is_damaged(tmp_path):
    _saved(tmp_path, steps=(1, 2))
    mp = tmp_path / "step-00000002" / ck.MARKER
    meta = json.loads(mp.read_text())
    meta["step"] = 17
    mp.write_text(json.dumps(meta))
    assert ck.verify(str(tmp_path / "step-00000002")) == (None, f"{ck.MARKER} fails its own checksum (edited, or "
                                                           "written by an older sapp)")
    assert ck.choose(str(tmp_path), log=lambda s: None)[0].endswith("step-00000001")


def test_resume_into_another_model_or_order_refused(tmp_path):
    _saved(tmp_path, steps=(1,), meta={"parallel": {"dp": 1, "tp": 1, "pp": 1}, "zero": 0, "data_position": 4})
    for cfg, what in (({"dims": (32, 64)}, "it holds 2 entries this model lacks (layers.1.fc.bias, layers.1.fc.weight)"),
                      ({"dims": (32, 64, 48)}, "head.weight is 10x64 float32 there, 10x48 float32 here (and 2 more)")):
        prog, names = _program(**cfg)
        with pytest.raises(CheckpointError, match="written for another model: " + what.replace("(", r"\(").replace(")", r"\)")):
            _resume(prog, names, tmp_path)
    prog, names = _program()
    with pytest.raises(CheckpointError, match="trained on --data synthetic in order, this run reads --data synthetic "
                                              "shuffled with --seed 0"):
        _resume(prog, names, tmp_path, shuffle=True)
    # --resume-partial: the matching entries load, the others keep their initial values
    prog, names = _program(dims=(32, 64, 48))
    init = {k: v.clone() for k, v in prog.modules[0].state_dict().items()}
    start, lines = _resume(prog, names, tmp_path, partial=True)
    ref, _ = _program()
    _step(ref, 1)
    got, want = prog.modules[0].state_dict(), ref.modules[0].state_dict()
    assert start == 1 and "partial: 3 of 6 entries loaded" in lines[0]
    assert torch.equal(got["layers.0.fc.weight"], want["layers.0.fc.weight"])
    assert not torch.equal(got["layers.0.fc.weight"], init["layers.0.fc.weight"])
    assert torch.equal(got["layers.1.fc.weight"], init["layers.1.fc.weight"])


def test_symlinked_entries_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    d = tmp_path / "c"
    prog, names, c = _saved(d, steps=(1,))
    os.symlink(outside, d / ".tmp-step-00000002")
    with pytest.raises(CheckpointError, match=r"\.tmp-step-00000002 is a symlink; a checkpoint directory holds only"):
        ck.check_directory(str(d))
    _step(prog, 2)
    with pytest.raises(CheckpointError, match="is a symlink or file"):
        c.save(prog, 2, {"global_batch": 4})
    assert os.listdir(outside) == []                 # nothing written through the link
    os.remove(d / ".tmp-step-00000002")
    os.symlink(d / "step-00000001", d / "step-00000005")
    assert [s for s, _ in ck.committed(str(d))] == [1]


def test_orphans_of_an_interrupted_cleanup_removed(tmp_path):
    """What kill -9 inside retention's delete leaves: a half-deleted .del-* - gone after the next save.
    A step-N whose marker is missing is not sapp's leftover (a delete renames to .del-* first): it
    may be a checkpoint being copied in, so it stays (issue 53; tests/test_checkpoint_foreign.py)."""
    prog, names, c = _saved(tmp_path, steps=(1, 2))
    shutil.copytree(tmp_path / "step-00000001", tmp_path / ".del-step-00000000")
    shutil.copytree(tmp_path / "step-00000001", tmp_path / "step-00000000")
    os.remove(tmp_path / "step-00000000" / ck.MARKER)
    _step(prog, 3)
    c.save(prog, 3, {"global_batch": 4})
    assert sorted(n for n in os.listdir(tmp_path) if n != ".sapp-lock") == ["step-00000000", "step-00000002",
                                                                             "step-00000003"]


# ---- finding 5: write failures --------------------------------------------------------------------------
def _file_limit(n):
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, old[1]))
    return old


def test_write_probe_failure_leaves_nothing(tmp_path):
    """A full disk, for real: the process may write files of 2 bytes at most (RLIMIT_FSIZE -> EFBIG)."""
    old = _file_limit(2)
    try:
        with pytest.raises(CheckpointError, match="is not writable"):
            ck.check_directory(str(tmp_path))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
    assert [n for n in os.listdir(tmp_path) if n.startswith(".sapp-write-test")] == []


def test_failed_write_mid_save_is_one_checkpoint_error(tmp_path):
    prog, names, c = _saved(tmp_path, steps=(1,))
    _step(prog, 2)
    old = _file_limit(20_000)            # the shard file (about 85 KB) fails part-way
    try:
        with pytest.raises(CheckpointError) as e:
            c.save(prog, 2, {"global_batch": 4})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
    msg = str(e.value)
    assert "\n" not in msg
    assert "/.tmp-step-00000002 failed on rank 0 (" in msg and "free there; check the disk, a quota" in msg
    assert ck.choose(str(tmp_path), log=lambda s: None)[0].endswith("step-00000001")


def test_dead_peer_inside_save_is_not_called_free_space(tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp
    prog, names, c = _saved(tmp_path, steps=(1,))

    def peer_gone(*a, **k):
        raise RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41234")
    monkeypatch.setattr(dcp, "save", peer_gone)
    with pytest.raises(CheckpointError, match="a rank died or stopped responding while checkpoint .* was written") as e:
        c.save(prog, 2, {"global_batch": 4})
    assert "free space" not in str(e.value)


def test_resealed_markers_and_metadata_with_bad_numbers_are_damaged_not_tracebacks(tmp_path):
    """A marker or .metadata edited and re-sealed (sizes, CRCs and checksum recomputed) with values of the
    wrong type or sign: verify() calls the step damaged in words, and --resume refuses it in one line."""
    from sapp.emit.runtime import dcp_reader
    _saved(tmp_path / "c")
    path = str(tmp_path / "c" / "step-00000001")
    mp, mdp = os.path.join(path, ck.MARKER), os.path.join(path, ".metadata")
    good_marker, good_md = open(mp).read(), open(mdp, "rb").read()

    def marker_with(files_value):
        meta = json.loads(good_marker)
        meta["files"][".metadata"] = files_value
        meta["checksum"] = ck.checksum(meta)
        with open(mp, "w") as f:
            json.dump(meta, f)

    for value in (5, "x", [1], [-1, 0], [True, 0], None):
        marker_with(value)
        got, why = ck.verify(path)
        assert got is None and "without a size and checksum" in why, (value, why)
    with open(mp, "w") as f:
        f.write(good_marker)

    def metadata_with(edit):
        md = dcp_reader.load_metadata(good_md, "x")
        edit(md)
        with open(mdp, "wb") as f:
            f.write(pickle.dumps(md))
        _reseal(path)
        return ck.verify(path)

    def first(md):
        return next(iter(md.storage_data.values()))
    cases = {"storage table": lambda md: setattr(md, "storage_data", 7),
             "offset and length": lambda md: setattr(first(md), "offset", -8),
             "non-negative integer offsets": lambda md: setattr(
                 next(iter(md.state_dict_metadata.values())).chunks[0], "offsets", torch.Size([-1] * 2)),
             "reads past the end": lambda md: setattr(first(md), "length", 1 << 40)}
    for words, edit in cases.items():
        got, why = metadata_with(edit)
        assert got is None and words in why, (words, why)
    prog, names = _program()                         # --resume: nothing intact, refused in one line
    with pytest.raises(CheckpointError, match="no intact checkpoint .* nothing was deleted"):
        _resume(prog, names, tmp_path / "c")
