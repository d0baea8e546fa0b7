"""Files a user names, read or written without trusting what the name points at: a FIFO, a device or
a socket in place of a plan would block `open` forever (or stream without end), so only regular
files are read, at most a bounded number of bytes, and an output path may not be a special file.
Files sapp writes into a folder it manages (a checkpoint directory: plans/, markers) go through
`write_atomic`: no symlink followed, a temporary name renamed into place."""
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


def read_text(path, limit: int, *, what: str, give: str, too_big: str, not_text: str, error):
    """The UTF-8 text of the regular file `path`, at most `limit` bytes; anything else raises `error`
    in one line: "{what} {path} not found", "... is a directory; {give}", a FIFO or device ("...; {give}"),
    "... is larger than N MB; {too_big}", "... is not text (not UTF-8); {not_text}".  Plans, clusters
    and engine files are read through this one reader."""
    try:
        raw = read_regular(path, limit)
    except TypeError as e:
        raise error(f"{what}: {e} (a str or os.PathLike)") from None
    except FileNotFoundError:
        raise error(f"{what} {path} not found") from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a directory; {give}") from None
    except SpecialFileError as e:
        raise error(f"{what} {e}; {give}") from None
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}") from None
    if len(raw) > limit:
        raise error(f"{what} {path} is larger than {limit >> 20} MB; {too_big}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not text (not UTF-8); {not_text}") from None


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


class SymlinkError(OSError):
    """A folder on the way to a file sapp writes is a symlink (or not a folder)."""


def _open_dirs(under: str, rel: str, make: bool) -> int:
    """A dir fd of `under`/`rel`, each component of `rel` opened with O_NOFOLLOW (created when `make`):
    a link planted among them cannot send the write elsewhere.  `under` itself is the user's name."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(under, flags)
    try:
        for part in [p for p in rel.split(os.sep) if p and p != "."]:
            if part == "..":
                raise SymlinkError(f"{os.path.join(under, rel)} leaves {under}")
            if make:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nxt = os.open(part, flags | getattr(os, "O_NOFOLLOW", 0), dir_fd=fd)
            except OSError as e:         # ELOOP: a symlink; ENOTDIR: a file
                raise SymlinkError(f"{os.path.join(under, rel)}: {part} is a symlink or not a folder "
                                   f"({e.strerror}); sapp writes only into folders it can open as such") from None
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def write_atomic(path, data, under=None, make: bool = False, mode: int = 0o644) -> None:
    """Write `data` (str or bytes) to `path` so that no symlink is followed and no reader sees half a
    file: a fresh temporary name is created O_EXCL | O_NOFOLLOW in path's folder (opened by a dir fd),
    written, fsynced and renamed over the name; the rename replaces a planted symlink itself, never
    what it points at.  `under`: the folder the user named (followed as given); every folder from it
    down to path's is opened without following links (`make`: created when missing).  OSError
    (SymlinkError for a planted link on the way) when it cannot."""
    import secrets
    path = as_path(path)
    parent, name = os.path.split(path)
    if not name:
        raise IsADirectoryError(path)
    parent = parent or "."
    rel = os.path.relpath(parent, under) if under is not None else "."
    dfd = _open_dirs(under if under is not None else parent, rel, make)
    tmp = f".{name[:100]}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0), mode, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data.encode() if isinstance(data, str) else data)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        os.fsync(dfd)
    finally:
        os.close(dfd)
