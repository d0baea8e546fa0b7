"""Retention of a checkpoint directory (sapp/emit/runtime/checkpoint.py describes its layout): what
rank 0 deletes after each commit, and the proof it asks first that sapp wrote what it deletes.

A user's checkpoint directory may hold things sapp never wrote: a checkpoint being copied in (its
marker comes last, or never), another tool's `step-N/`, another job's checkpoints.  Retention deletes
only
- committed checkpoints whose marker passes its own SHA-256 (sapp wrote it) and whose `run` is this
  job's or an ancestor's (the lineage the markers' `parent` fields chain: a resumed run takes over
  the retention of the run it continued), and
- sapp's own scratch names (`.tmp-step-N`, `.del-step-N`) that hold nothing but the files a save
  writes (DCP's `.metadata` and `__R_I.distcp`, the marker).
Anything else with a checkpoint's name is left where it is and named once (per job) in a warning."""
from __future__ import annotations

import json
import os
import re
import shutil

from .checkpoint_find import MARKER, _NAME, _is_dir, _is_file, checksum, committed, verify
from .train_state import CheckpointError

_SCRATCH = (".tmp-step-", ".del-step-")
# the files a save puts in a checkpoint: DCP's (its metadata goes through a .tmp rename) and the marker
# (and the marker's temporary name from fileio.write_atomic: a save killed between writing the marker and
# renaming it, as an elastic restart does when a node returns mid-save, leaves it in the scratch folder)
_SAVE_FILE = re.compile(r"^(\.metadata(\.tmp)?|__\d+_\d+\.distcp|" + re.escape(MARKER)
                        + r"|\." + re.escape(MARKER) + r"\.tmp-\d+-[0-9a-f]{8})$")
_MARKER_LIMIT = 64 << 20        # a marker lists every file and the model's entries: megabytes at most


def sapp_marker(path: str):
    """The marker of the checkpoint directory `path` when sapp wrote it (a plain file that parses and
    passes its own checksum; the data files need not match it: a damaged checkpoint is still sapp's),
    else None."""
    from ...fileio import read_regular
    mp = os.path.join(path, MARKER)
    if not _is_dir(path) or not _is_file(mp):
        return None
    try:
        meta = json.loads(read_regular(mp, _MARKER_LIMIT))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(meta, dict) or meta.get("checksum") != checksum(meta):
        return None
    return meta


def scratch_only(path: str) -> bool:
    """A real directory holding nothing but plain files a save writes: sapp's own scratch."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return _is_dir(path) and all(_SAVE_FILE.match(n) and _is_file(os.path.join(path, n)) for n in names)


def lineage(markers: dict, run) -> set:
    """The run ids whose checkpoints this job (`run`) may delete: its own and, through the markers'
    `parent` fields, every run it continues."""
    parent = {}
    for meta in markers.values():
        p = meta.get("parent")
        if isinstance(p, dict) and p.get("run") != meta.get("run"):
            parent.setdefault(meta.get("run"), set()).add(p.get("run"))
    runs, todo = set(), [run]
    while todo:
        r = todo.pop()
        if r not in runs:
            runs.add(r)
            todo += sorted(parent.get(r, ()), key=str)
    return runs


def discard(path: str) -> None:
    """Delete a committed checkpoint: renamed to .del-* first (atomic), so a kill mid-delete leaves a
    name the next save removes rather than a step-N that lost its marker but kept its number."""
    doomed = os.path.join(os.path.dirname(path), ".del-" + os.path.basename(path))
    if os.path.lexists(doomed):
        if not scratch_only(doomed):
            raise CheckpointError(f"{doomed} holds files sapp did not write; move it out of the checkpoint directory")
        shutil.rmtree(doomed, ignore_errors=True)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def retain(ck, keep_also: str = "", run=None) -> None:
    """Keep the newest `ck.keep` checkpoints that verify; delete this lineage's committed ones older
    than the oldest of those (a damaged newer one stays, skipped with a line on resume), then sapp's
    leftover scratch.  Never deleted: the checkpoint just written, the one this run resumed from, and
    anything sapp cannot show it wrote (warned about once, `ck._warned`)."""
    kept = []
    for _, path in reversed(committed(ck.directory)):
        if path in ck._good or verify(path)[0] is not None:
            ck._good.add(path)
            kept.append(path)
            if len(kept) == ck.keep:
                break
    markers = {p: m for p, m in ((p, sapp_marker(p)) for _, p in committed(ck.directory)) if m is not None}
    runs = lineage(markers, run)
    foreign = []
    if kept:
        for _, path in committed(ck.directory):
            spared = os.path.realpath(path) in ck._protected or path == keep_also
            if path < kept[-1] and not spared:
                if path not in markers or markers[path].get("run") not in runs:
                    foreign.append(os.path.basename(path))
                    continue
                discard(path)
                ck._good.discard(path)
    for n in sorted(os.listdir(ck.directory)):
        p = os.path.join(ck.directory, n)
        if n.startswith(_SCRATCH) and _is_dir(p) and scratch_only(p):
            shutil.rmtree(p, ignore_errors=True)
        elif n.startswith(_SCRATCH) and _NAME.match(n[5:]) or _NAME.match(n) and p not in markers:
            foreign.append(n)
    _warn(ck, foreign)


def _warn(ck, names) -> None:
    new = sorted(set(names) - ck._warned)
    if not new:
        return
    ck._warned.update(new)
    shown = ", ".join(n[:80] for n in new[:5]) + (f" and {len(new) - 5} more" if len(new) > 5 else "")
    ck.log(f"sapp run: warning: left in {ck.directory}: {shown} (not written by this job's sapp checkpoints: no "
           "intact sapp marker, another job's, or files a save does not write); retention does not delete them")
