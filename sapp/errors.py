"""Errors users see.  Every message is one line that says what to change; the CLI prints it without a
traceback.  Internal bugs stay ordinary exceptions so they are not mistaken for user errors."""


class SappError(Exception):
    """Base of all user-facing errors."""


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
