"""Errors users see.  Every message is one line that says what to change; the CLI prints it without a
traceback.  Internal bugs stay ordinary exceptions so they are not mistaken for user errors."""


MAX_MESSAGE = 2000         # characters of one error line; a long line is cut where it is printed


def shown(value, limit: int = 60) -> str:
    """`value` as an error message echoes it: its repr, cut to `limit` characters and then saying how
    long it was (a 10**6-character value once made a 1 MB error line, issue 53)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, (str, bytes)) else f"{len(text)} characters as written"
    return f"{text[:limit]}... ({size})"


def clip(text: str, limit: int = 160) -> str:
    """`text` cut to at most `limit` characters at a word boundary, with an ellipsis where it was cut:
    a message that quotes another (an exception's first line) never ends mid-word or mid-path."""
    text = str(text)
    if len(text) <= limit:
        return text
    head = text[:limit - 1]
    cut = head.rfind(" ")
    # a single long word (a path) keeps its head rather than disappearing
    return (head[:cut] if cut > limit // 2 else head).rstrip(" ,;:") + "\u2026"


def user_frame(err: BaseException, skip: tuple, width: int = 80):
    """(file name, line, source cut to `width`) of the innermost frame of `err`'s traceback whose file is
    under none of the `skip` folders (torch, sapp's own machinery) and is a real file: the user's line a
    failure went through (a model's op, a branch on a tensor's value); None when there is none."""
    import linecache
    import os
    tb, site = getattr(err, "__traceback__", None), None
    while tb is not None:
        f = tb.tb_frame.f_code.co_filename
        if not f.startswith(skip) and not f.startswith("<"):
            site = (f, tb.tb_lineno)
        tb = tb.tb_next
    if site is None:
        return None
    src = " ".join(linecache.getline(*site).split())
    return os.path.basename(site[0]), site[1], src[:width] + ("..." if len(src) > width else "")


class SappError(Exception):
    """Base of all user-facing errors.  The message is capped at MAX_MESSAGE characters (with its length
    said), so a value a message echoes unshortened cannot make a line of megabytes."""

    def __str__(self) -> str:
        text = super().__str__()
        if len(text) <= MAX_MESSAGE:
            return text
        return f"{text[:MAX_MESSAGE - 80]}... (the message ran to {len(text)} characters; cut)"


class ClusterError(SappError, ValueError):
    """A cluster description is invalid."""


class CaptureError(SappError):
    """A model could not be traced."""


class PlanError(SappError, ValueError):
    """A plan file is corrupt, of another schema version, or made for another model/cluster."""


class ConstraintError(SappError, ValueError):
    """User constraints contradict each other or the cluster."""


class InfeasibleError(SappError):
    """No configuration fits in memory.  Carries the numbers for the message."""

    def __init__(self, message, *, needed_bytes=None, capacity_bytes=None, best=None):
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.capacity_bytes = capacity_bytes
        self.best = best


class UsageError(SappError, ValueError):
    """A command-line argument or API argument is out of range or names an unusable path."""
