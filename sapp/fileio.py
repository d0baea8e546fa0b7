"""Files a user names, read or written without trusting what the name points at: a FIFO, a device or
a socket in place of a plan would block `open` forever (or stream without end), so only regular
files are read, at most a bounded number of bytes, and an output path may not be a special file."""
from __future__ import annotations

import os
import stat


class SpecialFileError(OSError):
    """The path names a FIFO, device or socket, not a regular file."""


def _kind(mode) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def as_path(path) -> str:
    """`path` as a str; TypeError (with a one-line message) for anything that is not a path."""
    if isinstance(path, bytes):
        return os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"a file path is needed, got {type(path).__name__}")
    return os.fspath(path)


def read_regular(path, limit: int) -> bytes:
    """At most limit + 1 bytes of the regular file `path` (the caller refuses more than `limit`).  Opened
    non-blocking, so a FIFO cannot stall the open; then anything but a regular file raises
    SpecialFileError (IsADirectoryError for a folder), and what `open` raises otherwise."""
    path = as_path(path)
    nonblock = getattr(os, "O_NONBLOCK", 0)       # (POSIX; elsewhere a FIFO cannot be named like a file)
    fd = os.open(path, os.O_RDONLY | nonblock | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(mode):
            raise SpecialFileError(f"{path} is {_kind(mode)}")
        if nonblock:
            os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            fd = None
            return f.read(limit + 1)
    finally:
        if fd is not None:
            os.close(fd)


def special_kind(path):
    """What `path` is when it exists and is neither a regular file nor a folder ("a FIFO (named
    pipe)", "a device", ...), else None: for outputs, where open(path, "w") on a FIFO blocks."""
    try:
        mode = os.stat(as_path(path)).st_mode
    except (OSError, TypeError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return _kind(mode)
