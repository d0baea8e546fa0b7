"""`sapp run` SIGKILLed at random moments under a CPU hog, and the job's processes left 10 s later
(issue 53, finding 4): `python -m bench.launcher_kills [--kills 20] [--hogs 2] [--seed 53]`.

Each kill picks a stage (the launcher starting, the workers starting, training: tests/launcher_kills.py)
and a victim (`sapp run`, or torch's agent under it) at random, waits for the stage and a random
0-1 s more, SIGKILLs the victim and counts the job's processes alive 10 s later.  Target: 0 orphans."""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.launcher_kills")
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--hogs", type=int, default=2, help="busy processes beside the job (default 2)")
    p.add_argument("--seed", type=int, default=53)
    args = p.parse_args(argv)
    from tests.launcher_kills import STAGES, cpu_hog, kill_at
    rng = random.Random(args.seed)
    orphaned, done, t0 = 0, 0, time.time()
    with tempfile.TemporaryDirectory(prefix="sapp-kills-") as tmp, cpu_hog(args.hogs, seconds=3600):
        for i in range(args.kills):
            stage, victim = rng.choice(STAGES), rng.choice(("sapp-run", "launcher"))
            t = kill_at(tmp, f"k{i}", stage, rng, victim=victim)
            if "skipped" in t:
                print(f"kill {i + 1:2d}: {stage:8s} {victim:8s} skipped: {t['skipped']}", flush=True)
                continue
            done += 1
            orphaned += bool(t["orphans"])
            print(f"kill {i + 1:2d}: {stage:8s} {victim:8s} {t['processes_at_kill']} processes at the kill, "
                  + (f"ORPHANS {t['orphans']}" if t["orphans"] else f"all gone after {t['gone_after_s']} s"), flush=True)
    print(f"{orphaned} of {done} kills left orphans 10 s later ({args.hogs} CPU hogs, {time.time() - t0:.0f} s)")
    return 1 if orphaned else 0


if __name__ == "__main__":
    sys.exit(main())
