"""A process of `sapp run` ends when the process that started it is gone.

`sapp run` starts the launcher (torchrun's agent, sapp/emit/runtime/launch.py), which starts one worker per
rank in a session of its own.  Killed with SIGKILL (a scheduler's hard timeout, the OOM killer,
`timeout -s KILL`), a parent runs no clean-up: its children are re-parented and train on, holding
the job's sockets, its checkpoint lock and two cores each, until someone finds them.

Each process sapp starts therefore asks the kernel for SIGKILL when its parent dies
(prctl PR_SET_PDEATHSIG), as the first thing its `main` does.  The parent says who it is in
SAPP_LIFELINE_PID before it starts the child, and the child compares that with `os.getppid()` *after*
the prctl: a parent that died between the fork and the prctl (easy at high load, where the child
may spend seconds starting Python) is caught there, and one that dies later is caught by the
kernel.  The variable is taken out of the environment at once, so a process started further down
never compares itself with a pid that is not its parent.

An earlier version polled `os.getppid()` from a thread against the parent seen at start, and the
launcher then SIGTERMed itself and waited up to 10 s for torch's agent to stop its workers: under
load the first sample could already be init's pid (so nothing ever fired), and the 10 s grace let
the workers write more checkpoints with no `sapp run` above them (issue 53, finding 4).  SIGKILL
needs no grace: checkpoints are written to a `.tmp-*` directory and renamed, so a killed worker
leaves no partial one that is taken for a checkpoint.

PR_SET_PDEATHSIG fires when the parent *thread* that forked the child ends.  `sapp run` starts the
launcher from its main thread and torch's agent starts its workers from its main thread (the agent's
run loop), so the thread lives as long as the process.  Where prctl is missing (not Linux) the
polling thread, comparing with the pid the parent stated, is the fallback."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

PARENT_ENV = "SAPP_LIFELINE_PID"
_PR_SET_PDEATHSIG = 1          # <linux/prctl.h>


def child_env(env: dict) -> dict:
    """`env` for a child this process starts, naming this process as the parent it must outlive."""
    return dict(env, **{PARENT_ENV: str(os.getpid())})


def _pdeathsig(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def bind_to_parent(who: str) -> None:
    """Die with the parent named in SAPP_LIFELINE_PID: SIGKILL from the kernel when it ends, or end now
    if it already has.  Started by hand (no variable), watch whatever parent this process has."""
    stated = os.environ.pop(PARENT_ENV, None)
    try:
        parent = int(stated) if stated else None
    except ValueError:
        parent = None
    if parent is None:
        watch_parent(exit_now(who))
        return
    if not _pdeathsig(signal.SIGKILL):
        watch_parent(exit_now(who), parent=parent)
    if os.getppid() != parent:          # it died before the prctl: the kernel will not tell us
        exit_now(who)()


def watch_parent(on_orphan, interval: float = 1.0, parent: int | None = None) -> threading.Thread:
    """Call `on_orphan()` (once, from a daemon thread) when this process's parent is no longer `parent`
    (default: the parent it has now)."""
    parent = os.getppid() if parent is None else parent

    def loop():
        while os.getppid() == parent:
            time.sleep(interval)
        on_orphan()

    t = threading.Thread(target=loop, name="sapp-lifeline", daemon=True)
    t.start()
    return t


def exit_now(who: str, code: int = 1):
    """Say it in one line (the parent's pipe may be gone) and end at once; a checkpoint being written
    stays a `.tmp-*` directory that is never taken for one."""
    def act():
        try:
            print(f"sapp run: {who} stopping: the process that started it is gone", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass
        os._exit(code)
    return act
