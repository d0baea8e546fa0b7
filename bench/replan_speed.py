"""Re-planning's CPU against a search's: `python -m bench.replan_speed [--reps N]`.

Issue 53 finding 9: `sapp replan plan.json --nodes 127` of GPT-3 175B (a plan for 128 x 8 A100-80GB,
global batch 1536) cost 7.9x the CPU of the search it replaces.  This runs, as the user does, `sapp
search --model gpt3-175b --cluster a100-80g:nodes=128` (the plan's own search; the capture cache warm)
and `sapp replan PLAN --nodes 127`, each in its own process, `--reps` times, and prints each one's
CPU seconds (user + system of the child: the box is shared, wall time is not the figure) and the
ratio of the medians.  Also `sapp search ... nodes=127`, which refuses (no uniform layout fits)."""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_of(args) -> tuple:
    """(CPU seconds of `sapp ARGS` in a child process, its exit status, its last line)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([sys.executable, "-m", "sapp.commands.cli", *args], cwd=ROOT, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = (p.stdout + p.stderr).strip().splitlines()
    return cpu, p.returncode, lines[-1] if lines else ""


def main(argv=None, out=sys.stdout):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        plan = os.path.join(d, "plan128.json")
        search = ["search", "--model", "gpt3-175b", "--cluster", "a100-80g:nodes=128"]
        cpu, rc, last = cpu_of(search + ["--out", plan])          # warms the capture cache too
        if rc:
            raise SystemExit(f"search failed: {last}")
        rows = {"search 128 nodes": [], "search 127 nodes": [], "replan to 127 nodes": []}
        for _ in range(args.reps):
            rows["search 128 nodes"].append(cpu_of(search)[0])
            rows["search 127 nodes"].append(cpu_of(["search", "--model", "gpt3-175b", "--cluster",
                                                    "a100-80g:nodes=127"])[0])
            c, rc, _ = cpu_of(["replan", plan, "--nodes", "127"])
            rows["replan to 127 nodes"].append(c)
        print("| command | CPU s (each run) | median |", file=out)
        print("|---|---|---|", file=out)
        for k, v in rows.items():
            print(f"| {k} | {', '.join(f'{x:.2f}' for x in v)} | {statistics.median(v):.2f} |", file=out)
        ratio = statistics.median(rows["replan to 127 nodes"]) / statistics.median(rows["search 128 nodes"])
        print(f"replan / search (128 nodes) CPU: {ratio:.2f}x", file=out)
        p = subprocess.run([sys.executable, "-m", "sapp.commands.cli", "replan", plan, "--nodes", "127"], cwd=ROOT,
                           capture_output=True, text=True)
        print("\n".join("    " + ln for ln in p.stdout.strip().splitlines()), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
