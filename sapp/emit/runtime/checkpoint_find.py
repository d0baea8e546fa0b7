"""Reading a checkpoint directory (sapp/emit/runtime/checkpoint.py describes its layout): which checkpoints
are committed, whether one is intact (its marker's own SHA-256, every file's size and CRC-32, DCP's
metadata through the restricted reader), and which one a run resumes from.

Resume rules (`resume_point`), each protecting checkpoints from loss:
- a named checkpoint must be intact; an unnamed resume takes the newest intact one, saying in one
  line which damaged newer ones it skipped;
- a directory holding only damaged checkpoints is refused (training from step 0 into it would let
  retention delete them), deleting nothing;
- a run that writes into a directory cannot resume an earlier step of it that later steps follow:
  its steps would replace the other run's of the same number and retention, newest by step, would
  keep the other run's later ones — refused, naming another --checkpoint-dir as the way;
- a worker restarted by torchrun resumes its own run's newest checkpoint (the marker's `run` id),
  not the --resume it was first started with."""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import zlib

from .train_state import CheckpointError

MARKER = "sapp-checkpoint.json"
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


def _is_dir(path: str) -> bool:
    """A real directory, not a symlink to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def committed(directory: str) -> list:
    """[(step, path)] of committed checkpoints (by name and marker), oldest first; not verified."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    out = []
    for n in names:
        m = _NAME.match(n)
        p = os.path.join(directory, n)
        if m and _is_dir(p) and _is_file(os.path.join(p, MARKER)):
            out.append((int(m.group(1)), p))
    return sorted(out)


def checksum(meta: dict) -> str:
    """SHA-256 of a marker's fields (all but `checksum` itself), canonical JSON."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def verify(path: str) -> tuple:
    """(marker dict, None) when the marker is intact and every file matches it, else (None, why in a
    few words).  Reads .metadata through the restricted unpickler (nothing in it is executed)."""
    if not _is_dir(path):
        return None, "it is not a directory" + (" (a symlink)" if os.path.islink(path) else "")
    mp = os.path.join(path, MARKER)
    if not _is_file(mp):
        return None, f"{MARKER} is missing or not a plain file"
    try:
        with open(mp) as f:
            meta = json.load(f)
        files = meta["files"]
        files.items()
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        return None, f"unreadable {MARKER} ({type(e).__name__})"
    bad = next((n for n, e in files.items() if not (isinstance(e, list) and len(e) == 2 and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in e))), None)
    if bad is not None:
        return None, f"{MARKER} lists {bad[:80]!r} without a size and checksum (the marker was altered)"
    if meta.get("checksum") != checksum(meta):
        return None, f"{MARKER} fails its own checksum (edited, or written by an older sapp)"
    m = _NAME.match(os.path.basename(os.path.normpath(path)))
    if m and int(m.group(1)) != meta.get("step"):
        return None, f"{MARKER} is for step {meta.get('step')}, not {int(m.group(1))}"
    for name, entry in sorted(files.items()):
        p = os.path.join(path, name)
        if os.path.basename(name) != name or name in (".", ".."):
            return None, f"{MARKER} lists {name[:80]!r}, not a file of the checkpoint"
        if not _is_file(p):
            return None, f"{name} is missing" if not os.path.lexists(p) else f"{name} is not a plain file"
        size, crc = entry
        if os.path.getsize(p) != size:
            return None, f"{name} has {os.path.getsize(p)} bytes, {size} were written"
        if _crc(p) != crc:
            return None, f"{name} fails its checksum"
    if ".metadata" not in files:
        return None, "no DCP .metadata"
    from . import dcp_reader
    try:
        md = dcp_reader.read(path)
    except CheckpointError as e:
        return None, str(e).replace(os.path.join(path, ""), "")
    storage = md.storage_data or {}
    stray = sorted({i.relative_path for i in storage.values()} - set(files))
    if stray:
        return None, f".metadata points at {stray[0][:80]}, which the marker does not list"
    past = next((i for i in storage.values() if i.offset + i.length > files[i.relative_path][0]), None)
    if past is not None:
        return None, f".metadata reads past the end of {past.relative_path[:80]} (the checkpoint was altered)"
    return meta, None


def identity_diff(saved: dict, mine: dict) -> tuple:
    """(what differs in a few words or None, names whose shape and dtype match in both) for two
    {name: [shape, dtype]} tables (a marker's model_state and this model's)."""
    same = {k for k in saved.keys() & mine.keys() if list(saved[k][0]) == list(mine[k][0]) and saved[k][1] == mine[k][1]}
    extra, lacking = sorted(saved.keys() - mine.keys()), sorted(mine.keys() - saved.keys())
    other = sorted(k for k in saved.keys() & mine.keys() if k not in same)
    parts = []
    if extra:
        parts.append(f"it holds {len(extra)} entr{'y' if len(extra) == 1 else 'ies'} this model lacks ({', '.join(extra[:3])}"
                     f"{', ...' if len(extra) > 3 else ''})")
    if lacking:
        parts.append(f"this model has {len(lacking)} it lacks ({', '.join(lacking[:3])}{', ...' if len(lacking) > 3 else ''})")
    if other:
        k = other[0]
        parts.append(f"{k} is {_shape(saved[k])} there, {_shape(mine[k])} here"
                     + (f" (and {len(other) - 1} more)" if len(other) > 1 else ""))
    return ("; ".join(parts) or None), same


def _shape(entry) -> str:
    return "x".join(str(int(d)) for d in entry[0]) + f" {entry[1]}" if entry[0] else f"scalar {entry[1]}"


def choose(directory: str, log=print, run: str = None):
    """(path, marker) of the newest intact checkpoint in `directory` (of run `run` only, when given), or
    None; one line per damaged one."""
    skipped = []
    for step, path in reversed(committed(directory)):
        meta, why = verify(path)
        if meta is not None and run is not None and meta.get("run") != run:
            continue
        if meta is not None:
            for bad, reason in skipped:
                log(f"sapp run: checkpoint {bad} is damaged ({reason}); resuming from {path} instead")
            return path, meta
        if run is None:
            skipped.append((path, why))
    for bad, reason in skipped:
        log(f"sapp run: checkpoint {bad} is damaged ({reason}) and no older intact one is left")
    return None


def resume_point(directory: str, path: str = None, writing: bool = True, log=print, run: str = None):
    """(path, marker) a run resumes from, or None when `directory` holds no checkpoint yet.

    `path`: the one the user named (it must be intact); else the newest intact one in `directory`.
    `run`: a restarted worker's own run id: its newest checkpoint comes first (a restart goes on from
    where this run got, not from the --resume it was started with).  Refused in one line, deleting
    nothing: a directory whose checkpoints are all damaged (training from step 0 would let retention
    delete them), and, for a run that writes into `directory`, a named checkpoint of it that later
    steps follow: the new run's steps would replace the old run's of the same number, and retention
    (newest by step) would keep the old run's later ones and delete the new run's."""
    if run is not None and writing:
        own = choose(directory, log=lambda _m: None, run=run)
        if own is not None:
            return own
    if path:
        meta, why = verify(path)
        if meta is None:
            raise CheckpointError(f"cannot resume from {path}: {why}; pass another checkpoint to --resume")
        if writing and _same_dir(os.path.dirname(os.path.abspath(path)), directory):
            later = [s for s, _ in committed(directory) if s > int(meta.get("step", 0))]
            if later and meta.get("run") is not None and run is not None and meta.get("run") == run:
                later = []                   # this run's own restart point (older sapp markers have no run)
            if later:
                raise CheckpointError(
                    f"cannot resume {path} into {directory}: it holds later steps ({', '.join(map(str, later[:4]))}"
                    f"{', ...' if len(later) > 4 else ''}) of the run that wrote it, which this run would overwrite and "
                    f"retention would mix up; pass another --checkpoint-dir for the new run (it still resumes from {path})")
        return path, meta
    found = choose(directory, log=log)
    if found is None and committed(directory):
        bad = [p for _, p in committed(directory)]
        raise CheckpointError(
            f"--resume found no intact checkpoint in {directory} ({len(bad)} damaged: {os.path.basename(bad[-1])}"
            f"{' ...' if len(bad) > 1 else ''}); nothing was deleted: pass an intact one to --resume, or start "
            "afresh with another --checkpoint-dir")
    return found


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)
