"""Run a saved plan with `sapp run` in a subprocess (what the accuracy benches measure)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def run_saved_plan(plan_path, model, procs, steps, res_path, timeout_s, extra=()):
    """Returns (result JSON of `sapp run --out`, None) or (None, a one-line status), and the wall time."""
    if os.path.exists(res_path):
        os.remove(res_path)
    cmd = [sys.executable, "-m", "sapp.cli", "run", str(plan_path), "--model", model, "--steps", str(steps),
           "--out", str(res_path), "--nproc", str(procs), *extra]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"run timed out after {timeout_s} s", time.perf_counter() - t0
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not os.path.exists(res_path):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-4:]
        return None, f"run failed (exit {proc.returncode}): {' | '.join(tail)}", wall
    with open(res_path) as f:
        return json.load(f), None, wall
