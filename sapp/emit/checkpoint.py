"""Checkpoints of a training run on disk: written with torch.distributed.checkpoint (every rank its own
shards, see sapp/emit/train_state.py for what is in them), committed atomically, verified on resume.

Layout of --checkpoint-dir:
    step-00000004/            a committed checkpoint after 4 training steps
        .metadata, __<rank>_0.distcp   DCP's files
        sapp-checkpoint.json  the commit marker: step, data position, losses so far, plan, and the size
                              and CRC-32 of every file (written last, before the rename)
    .tmp-step-00000006/       a checkpoint being written: never taken for one

Commit: all ranks dcp.save into .tmp-step-N; rank 0 then checksums the files, writes the marker and
renames the directory (atomic on POSIX).  A crash at any point leaves either the previous checkpoint as
the latest or the new one complete.  Retention: after each commit rank 0 deletes the oldest committed
checkpoints beyond --keep and any stale .tmp-* directory.

Resume: rank 0 walks the committed checkpoints newest first and takes the first whose files all match
their marker (a damaged newer one is reported in one line and skipped), then tells every rank which.
The directory must be shared by all ranks (one machine, or a shared filesystem across nodes)."""
from __future__ import annotations

import json
import os
import re
import shutil
import zlib

from .train_state import CheckpointError, LoadTargets, Names, save_entries

MARKER = "sapp-checkpoint.json"
# Checkpoint collectives wait for the slowest rank's writes: minutes for a large model, far beyond the
# training group's short hang timeout (sapp/emit/dist.py).  They run on their own gloo group (object
# collectives on the CPU, also under nccl); a rank that dies meanwhile is ended by torchrun's agent.
TIMEOUT_S = 600.0
_NAME = re.compile(r"^step-(\d{8})$")


def step_dir(directory: str, step: int) -> str:
    return os.path.join(directory, f"step-{step:08d}")


def _crc(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            crc = zlib.crc32(chunk, crc)
    return crc


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def committed(directory: str) -> list:
    """[(step, path)] of committed checkpoints (by name and marker), oldest first; not verified."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    out = []
    for n in names:
        m = _NAME.match(n)
        if m and os.path.isfile(os.path.join(directory, n, MARKER)):
            out.append((int(m.group(1)), os.path.join(directory, n)))
    return sorted(out)


def verify(path: str) -> tuple:
    """(marker dict, None) when every file matches the marker, else (None, why in a few words)."""
    try:
        with open(os.path.join(path, MARKER)) as f:
            meta = json.load(f)
        files = meta["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"unreadable {MARKER} ({type(e).__name__})"
    for name, (size, crc) in sorted(files.items()):
        p = os.path.join(path, name)
        if not os.path.isfile(p):
            return None, f"{name} is missing"
        if os.path.getsize(p) != size:
            return None, f"{name} has {os.path.getsize(p)} bytes, {size} were written"
        if _crc(p) != crc:
            return None, f"{name} fails its checksum"
    if ".metadata" not in files:
        return None, "no DCP .metadata"
    return meta, None


def choose(directory: str, log=print):
    """(path, marker) of the newest intact checkpoint in `directory`, or None; one line per damaged one."""
    skipped = []
    for step, path in reversed(committed(directory)):
        meta, why = verify(path)
        if meta is not None:
            for bad, reason in skipped:
                log(f"sapp run: checkpoint {bad} is damaged ({reason}); resuming from {path} instead")
            return path, meta
        skipped.append((path, why))
    for bad, reason in skipped:
        log(f"sapp run: checkpoint {bad} is damaged ({reason}) and no older intact one is left")
    return None


def estimate_bytes(params: int, optimizer: str = "adam") -> int:
    """One checkpoint's size: fp32 parameters plus the optimizer's fp32 state, plus 10% for DCP."""
    states = {"adam": 2, "adamw": 2, "sgd": 0}.get(optimizer, 2)
    return int(params * 4 * (1 + states) * 1.1) + (1 << 20)


def check_directory(directory: str, need_bytes: int = 0, resuming: bool = True) -> None:
    """Refuse an unwritable or too-full checkpoint directory before any training (creates it), and,
    for a run that starts afresh, one that holds another run's checkpoints (retention orders by step:
    the old run's later steps would outlive the new run's and be what a restart resumes from)."""
    from ..units import fmt_bytes
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".sapp-write-test-{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"sapp")
        os.remove(probe)
    except OSError as e:
        raise CheckpointError(f"checkpoint directory {directory} is not writable ({e.strerror or type(e).__name__}); "
                              "choose another --checkpoint-dir") from None
    old = committed(directory)
    if old and not resuming:
        raise CheckpointError(f"checkpoint directory {directory} already holds checkpoints (up to step {old[-1][0]}); "
                              "pass --resume to continue from them, or choose an empty --checkpoint-dir")
    free = shutil.disk_usage(directory).free
    if free < need_bytes:
        raise CheckpointError(f"checkpoint directory {directory} has {fmt_bytes(free)} free but one checkpoint needs "
                              f"about {fmt_bytes(need_bytes)}; free space or choose another --checkpoint-dir")


def _collective(fn, world: int, group=None):
    """Run `fn` on rank 0 only and give every rank its result (or its CheckpointError)."""
    import torch.distributed as dist
    if world == 1 or not dist.is_initialized():
        try:
            return fn()
        except OSError as e:
            raise CheckpointError(f"checkpoint I/O failed in {getattr(e, 'filename', None) or '?'}: {e.strerror or e}") from None
    box = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", fn())
        except CheckpointError as e:
            box[0] = ("error", str(e))
        except OSError as e:         # the disk filled up or went away mid-run: every rank stops cleanly
            box[0] = ("error", f"checkpoint I/O failed in {getattr(e, 'filename', None) or '?'}: {e.strerror or e}")
    dist.broadcast_object_list(box, src=0, group=group)
    kind, value = box[0]
    if kind == "error":
        raise CheckpointError(value)
    return value


class Checkpointer:
    """Save and find checkpoints of one run in `directory` (every call is collective over all ranks)."""

    def __init__(self, directory: str, *, keep: int = 2, names: Names = None, world: int = 1, log=print):
        """`names`: sapp.emit.train_state.model_names(model) of the model given to emit."""
        if keep < 1:
            raise CheckpointError(f"--keep {keep} would delete every checkpoint; keep at least 1")
        self.directory, self.keep, self.names, self.world, self.log = directory, keep, names or Names(), world, log
        self.group = None
        import torch.distributed as dist
        if world > 1 and dist.is_initialized():        # every rank constructs it at the same point
            from datetime import timedelta
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=TIMEOUT_S))

    def check(self, need_bytes: int, resuming: bool) -> None:
        _collective(lambda: check_directory(self.directory, need_bytes, resuming), self.world, self.group)

    def save(self, prog, step: int, meta: dict) -> str:
        import torch.distributed.checkpoint as dcp
        final = step_dir(self.directory, step)
        tmp = os.path.join(self.directory, f".tmp-step-{step:08d}")
        if prog.rank == 0:      # a stale one from a crashed run; the others write only after rank 0 plans
            shutil.rmtree(tmp, ignore_errors=True)
        try:
            dcp.save(save_entries(prog, self.names), checkpoint_id=tmp, process_group=self.group)
        except CheckpointError:
            raise
        except Exception as e:     # DCP gathers any rank's write error and raises it on every rank
            first = next((ln for ln in str(e).splitlines() if "Error" in ln), str(e).splitlines()[0] if str(e) else "")
            raise CheckpointError(f"writing checkpoint {tmp} failed ({type(e).__name__}: {first.strip()[:200]}); "
                                  "free space in --checkpoint-dir or choose another") from None
        return _collective(lambda: self._commit(tmp, final, step, meta), self.world, self.group)

    def _commit(self, tmp: str, final: str, step: int, meta: dict) -> str:
        files = {n: [os.path.getsize(os.path.join(tmp, n)), _crc(os.path.join(tmp, n))] for n in sorted(os.listdir(tmp))}
        with open(os.path.join(tmp, MARKER), "w") as f:
            json.dump(dict(meta, step=step, files=files), f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(final):        # the same step saved again (a resumed run): replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(self.directory)
        self._retain()
        return final

    def _retain(self) -> None:
        for _, path in committed(self.directory)[:-self.keep]:
            shutil.rmtree(path, ignore_errors=True)
        for n in os.listdir(self.directory):
            if n.startswith(".tmp-step-"):
                shutil.rmtree(os.path.join(self.directory, n), ignore_errors=True)

    def find(self, path: str = None):
        """(path, marker) to resume from: `path` itself when given (it must be intact), else the newest
        intact checkpoint in the directory, else None."""
        def pick():
            if path:
                meta, why = verify(path)
                if meta is None:
                    raise CheckpointError(f"cannot resume from {path}: {why}; pass another checkpoint to --resume")
                return path, meta
            return choose(self.directory, log=self.log)
        return _collective(pick, self.world, self.group)

    def load(self, prog, path: str) -> None:
        import torch.distributed.checkpoint as dcp
        available = set(dcp.FileSystemReader(path).read_metadata().state_dict_metadata)
        targets = LoadTargets(prog, self.names, available)
        dcp.load(targets.entries, checkpoint_id=path, process_group=self.group)
        targets.finish()
