"""Run a saved plan in a subprocess (what the accuracy benches measure): `sapp run`, or
`bench.paired_run` under torchrun."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def run_saved_plan(plan_path, model, procs, steps, res_path, timeout_s, extra=()):
    """Returns (result JSON of `sapp run --out`, None) or (None, a one-line status), and the wall time."""
    cmd = [sys.executable, "-m", "sapp.commands.cli", "run", str(plan_path), "--model", model, "--steps", str(steps),
           "--out", str(res_path), "--nproc", str(procs), *extra]
    return run_for_json(cmd, res_path, timeout_s, "run")


def run_paired(plan_path, model, procs, steps, res_path, timeout_s, rounds=3):
    """`bench.paired_run` under torchrun: the plan's steps and the calibration's reference block
    alternately in the same processes, `rounds` rounds sharing the `steps` (one per round untimed).
    (result JSON, None) or (None, status), and the wall time."""
    per_round = max(2, (steps - 1) // rounds)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}",
           "-m", "bench.paired_run", str(plan_path), "--model", model, "--steps", str(per_round),
           "--rounds", str(rounds), "--out", str(res_path)]
    return run_for_json(cmd, res_path, timeout_s, "paired run")


def run_for_json(cmd, res_path, timeout_s, what):
    """Run `cmd` (which writes `res_path`) with a hard timeout: (its JSON, None) or (None, a one-line
    status naming `what`), and the wall time."""
    if os.path.exists(res_path):
        os.remove(res_path)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"{what} timed out after {timeout_s} s", time.perf_counter() - t0
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not os.path.exists(res_path):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-4:]
        return None, f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}", wall
    with open(res_path) as f:
        return json.load(f), None, wall
