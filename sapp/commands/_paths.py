"""Output paths checked before any work starts: a search or a calibration must not run for minutes
and then fail to write its result."""
from __future__ import annotations

import os

from ..errors import UsageError
from ..fileio import special_kind


def check_out(path, flag="--out", suffixes=None) -> str:
    """Refuse `path` unless a file can be created there: its folder exists and is writable, it is not
    itself a folder, and (when `suffixes` is given) its extension is one of them.  Returns it."""
    path = os.fspath(path)
    if not path or path.endswith(os.sep):
        raise UsageError(f"{flag} {path!r} is not a file name; give a path like plan.json")
    kind = special_kind(path)
    if kind:        # open(path, "w") on a FIFO blocks until a reader comes; a device is no result file
        raise UsageError(f"{flag} {path} is {kind}, not a file; choose a regular file path")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a directory; give a file name inside it, e.g. {os.path.join(path, 'out.json')}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {path}: folder {folder} does not exist; create it or choose another path")
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {path} is not writable; choose another path")
    if suffixes is not None:
        ext = os.path.splitext(path)[1].lower().lstrip(".")
        if ext not in suffixes:
            raise UsageError(f"{flag} {path}: unknown file type {('.' + ext) if ext else '(no extension)'}; "
                             f"use one of {', '.join('.' + s for s in sorted(suffixes))}")
    return path


def written_beside(args) -> str:
    """What `plan written to PATH` adds where the operators went to their side file."""
    if getattr(args, "full", True):
        return ""
    from ..plan import operators_path
    return f" (its operators map in {operators_path(args.out)}; --full for one file)"
