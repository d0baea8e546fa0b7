"""A process of `sapp run` ends when the process that started it is gone.

`sapp run` starts the launcher (torchrun's agent, sapp/emit/runtime/launch.py), which starts one worker per
rank in a session of its own.  Killed with SIGKILL (a scheduler's hard timeout, the OOM killer,
`timeout -s KILL`), a parent runs no clean-up: its children are re-parented and train on, holding
the job's sockets, its checkpoint lock and two cores each, until someone finds them.  Each of these
processes therefore watches the parent it was started by: a daemon thread compares `os.getppid()`
with the parent it saw at start, every `interval` seconds, and acts when they differ.

PR_SET_PDEATHSIG would be quicker, but it fires when the parent *thread* that forked the child ends,
not the process, and torch's agent gives no promise about which thread starts workers; polling the
parent's pid has no such trap and costs one syscall a second."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time


def watch_parent(on_orphan, interval: float = 1.0) -> threading.Thread:
    """Call `on_orphan()` (once, from a daemon thread) when this process's parent changes."""
    parent = os.getppid()

    def loop():
        while os.getppid() == parent:
            time.sleep(interval)
        on_orphan()

    t = threading.Thread(target=loop, name="sapp-lifeline", daemon=True)
    t.start()
    return t


def exit_now(who: str, code: int = 1):
    """For a worker: say it in one line (the launcher's pipe may be gone) and end at once; a checkpoint
    being written stays a `.tmp-*` directory that is never taken for one."""
    def act():
        try:
            print(f"sapp run: {who} stopping: the process that started it is gone", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass
        os._exit(code)
    return act


def terminate_then_exit(grace_s: float = 10.0):
    """For the launcher: SIGTERM itself, so torch's agent stops its workers as it does on any SIGTERM,
    and end for good after `grace_s` whatever the agent does (the workers watch it in turn)."""
    def act():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(1)
    return act
