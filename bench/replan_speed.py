"""Re-planning's CPU against a search's: `python -m bench.replan_speed [--reps N]`.

Issue 53 finding 9: `sapp replan plan.json --nodes 127` of GPT-3 175B (a plan for 128 x 8 A100-80GB,
global batch 1536) cost 7.9x the CPU of the search it replaces.  This runs, as the user does, `sapp
search --model gpt3-175b --cluster a100-80g:nodes=128` (the plan's own search; the capture cache warm)
and `sapp replan PLAN --nodes 127`, each in its own process, `--reps` times, and prints each one's
CPU seconds (user + system of the child: the box is shared, wall time is not the figure) and the
ratio of the medians.  Also `sapp search ... nodes=127`, which refuses (no uniform layout fits).

bench/RESULTS.md §17's run (2026-12-02): of the ~3.2 s, ~1.1 s prices the 12 candidate counts (best
step so far as cutoff) and ~0.8 s the 7 idle nodes as a second data-parallel group (without it ~2.4 s,
1.35-1.5x).  The plan: 120 nodes (dp 48 tp 4 pp 5), 26.99 s/step; its note prices the 7 idle nodes as a
second group at 26.52 s/step (1.8% faster, batch shares 1488 + 48).  Re-measured after the split reuses
the winning count's own result for the big group alone (one bounded search fewer; plan and output
byte-identical), load average 6.3 on the 2 cores: search 1.79, 1.89, 1.87 (median 1.87), replan 3.19,
3.21, 3.38 (median 3.21): 1.72x (1.67x in a quieter run), within the noise.  In-process (cProfile of
`replan`, 2.3-2.8 CPU-s): the 12 counts 1.57 s (126 nodes priced exactly 0.41, 120 nodes 0.34, 96 and 64
nodes proved slower 0.37 and 0.17: 34 new stage profiles for 768 devices' dp values), the split 0.65 s,
of which the big group at its 1488 share 0.45-0.49 (new profiles: the top micro-batch sample of every dp
changes with the share) and the 7 nodes at 48 samples 0.13-0.15; the walk's bounded searches 0.07.  The
two exact group searches are what the note's figures are, so cutting the split further needs stage
profiles that carry across shares (the top sample), not fewer searches."""
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
            c, rc, last = cpu_of(["replan", plan, "--nodes", "127"])
            if rc:
                raise SystemExit(f"replan failed: {last}")
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
