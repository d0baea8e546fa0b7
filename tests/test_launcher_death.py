"""Workers die with their launcher: `sapp run` killed with SIGKILL (a scheduler's hard timeout, the
OOM killer) left every worker training on, re-parented to init, for as long as its steps lasted.
Here a 2-rank job with far more steps than it can finish is started, its `sapp run` process (then,
in a second job, torch's agent under it) is SIGKILLed once steps are being logged, and no process of
the job may be alive 10 s later (sapp/emit/runtime/lifeline.py)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _job_pids(token: str) -> list:
    """Processes whose command line names this job's unique plan file."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token in cmd and state != "Z":
            out.append(int(pid))
    return out


def _children(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _start(tmp_path, name):
    import sapp.models as models
    from tests.emit_workers.plans import make_plan
    plan = tmp_path / f"{name}-plan.json"
    make_plan(name="mlp-tiny", params=models.info("mlp-tiny")["params"], global_batch=8, dp=2).save(plan)
    log = tmp_path / f"{name}.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "sapp.commands.cli", "run", str(plan), "--model", "mlp-tiny",
                             "--steps", "100000000", "--log-json", str(log)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:      # until both ranks have logged a step
        logs = [tmp_path / f"{name}.jsonl", tmp_path / f"{name}.rank1.jsonl"]
        if all(p.exists() and any(json.loads(ln).get("step") is not None for ln in p.read_text().splitlines()[:3]
                                  if ln.strip()) for p in logs):
            break
        time.sleep(0.5)
    assert proc.poll() is None, "the job ended before it could be killed"
    return proc, str(plan)


def _survivors_after(token: str, seconds: float) -> list:
    deadline = time.time() + seconds
    while time.time() < deadline:
        alive = _job_pids(token)
        if not alive:
            return []
        time.sleep(0.5)
    return _job_pids(token)


@pytest.mark.parametrize("victim", ["sapp-run", "agent"])
def test_no_worker_survives_a_sigkilled_launcher(tmp_path, victim):
    proc, token = _start(tmp_path, victim)
    try:
        pids = _job_pids(token)
        assert len(pids) >= 4, pids            # sapp run, torch's agent, two workers
        target = proc.pid if victim == "sapp-run" else _children(proc.pid)[0]
        os.kill(target, signal.SIGKILL)
        left = _survivors_after(token, 10.0)
        assert left == [], f"alive 10 s after SIGKILL of the {victim}: {left}"
    finally:
        for pid in _job_pids(token):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait(timeout=30)


def test_no_process_survives_a_sigkill_at_any_moment_under_load(tmp_path):
    """Issue 53, finding 4: under a CPU hog the lifeline thread sampled its parent only after torch's
    import, when `sapp run` could already be gone (init's pid was then taken for the parent), and the
    launcher waited 10 s for torch's agent to stop the workers.  `sapp run` is SIGKILLed as the launcher
    starts, its agent as the workers start, and `sapp run` while they train: nothing of the job may be
    alive 10 s later."""
    import random
    from tests.launcher_kills import cpu_hog, kill_at
    rng = random.Random(53)
    kills = [("launcher", "sapp-run"), ("workers", "launcher"), ("training", "sapp-run")]
    with cpu_hog(2, seconds=240):
        trials = [kill_at(str(tmp_path), f"k{i}", stage, rng, jitter=0.5, victim=victim)
                  for i, (stage, victim) in enumerate(kills)]
    done = [t for t in trials if "skipped" not in t]
    assert len(done) == len(kills), trials
    assert all(t["processes_at_kill"] >= 2 for t in done), trials      # sapp run and its launcher at least
    assert [t for t in done if t["orphans"]] == [], trials
