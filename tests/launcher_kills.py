"""SIGKILL of `sapp run` at a chosen moment of a job's life, under a CPU hog, and the job's processes
still alive some seconds later (issue 53, finding 4).  Used by tests/test_launcher_death.py (a few kills)
and bench/launcher_kills.py (twenty).

The moments are the stages where a lifeline can miss: the launcher just started (still importing,
before any check of its parent), the workers just started (same, one level down), and training.
Each kill waits for its stage, then a seeded random 0-`jitter` s more; the victim is `sapp run` or
torch's agent under it (then the workers' own lifeline is what is tried)."""
from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("launcher", "workers", "training")


def procs() -> dict:
    """{pid: (parent pid, command line)} of every live, non-zombie process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
        except OSError:
            continue
        if fields[0] != "Z":
            out[int(d)] = (int(fields[1]), cmd)
    return out


def job_pids(token: str) -> list:
    return sorted(p for p, (_, cmd) in procs().items() if token in cmd and p != os.getpid())


@contextlib.contextmanager
def cpu_hog(n: int = 2, seconds: float = 300):
    """`n` busy processes (each ends by itself after `seconds`, should this one be killed)."""
    code = f"import time\nt=time.time()+{seconds}\nwhile time.time()<t: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]
    try:
        yield hogs
    finally:
        for h in hogs:
            h.kill()
            h.wait(timeout=30)


def _reached(stage: str, token: str, log: str) -> bool:
    kids = {p: cmd for p, (_, cmd) in procs().items() if token in cmd}
    launchers = [p for p, cmd in kids.items() if "sapp.emit.runtime.launch" in cmd]
    if stage == "launcher":
        return bool(launchers)
    workers = [p for p, cmd in kids.items() if "sapp.commands.run_worker" in cmd and "runtime.launch" not in cmd]
    if stage == "workers":
        return len(workers) >= 2
    return os.path.exists(log) and os.path.getsize(log) > 0


def start(tmp, name: str):
    import sapp.models as models
    from tests.emit_workers.plans import make_plan
    plan = os.path.join(tmp, f"{name}-plan.json")
    make_plan(name="mlp-tiny", params=models.info("mlp-tiny")["params"], global_batch=8, dp=2).save(plan)
    log = os.path.join(tmp, f"{name}.jsonl")
    proc = subprocess.Popen([sys.executable, "-m", "sapp.commands.cli", "run", plan, "--model", "mlp-tiny",
                             "--steps", "100000000", "--log-json", log], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    return proc, plan, log


def _victim(victim: str, proc, token: str) -> int:
    if victim == "sapp-run":
        return proc.pid
    return next((p for p, (pp, cmd) in procs().items() if pp == proc.pid and "sapp.emit.runtime.launch" in cmd),
                proc.pid)


def kill_at(tmp, name: str, stage: str, rng: random.Random, jitter: float = 1.0, wait_s: float = 240,
            grace_s: float = 10.0, victim: str = "sapp-run") -> dict:
    """One trial: start, wait for `stage`, SIGKILL `sapp run` (or, victim="launcher", torch's agent
    under it); which of the job's processes are alive `grace_s` later (all of them are then killed,
    so a failing trial leaves nothing behind)."""
    proc, token, log = start(tmp, name)
    try:
        deadline = time.time() + wait_s
        while time.time() < deadline and proc.poll() is None and not _reached(stage, token, log):
            time.sleep(0.05)
        if proc.poll() is not None or time.time() >= deadline:
            return {"stage": stage, "skipped": f"job ended or stalled before {stage} (rc {proc.poll()})"}
        time.sleep(rng.uniform(0, jitter))
        seen = len(job_pids(token))
        os.kill(_victim(victim, proc, token), signal.SIGKILL)
        t0 = time.time()
        while time.time() - t0 < grace_s and job_pids(token):
            time.sleep(0.2)
        left = job_pids(token)
        return {"stage": stage, "victim": victim, "processes_at_kill": seen, "orphans": left,
                "gone_after_s": None if left else round(time.time() - t0, 2)}
    finally:
        for pid in job_pids(token):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
