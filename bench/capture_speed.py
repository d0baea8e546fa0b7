"""Capture time per zoo model: `python -m bench.capture_speed [--direct] [names...]`.

Prints, per model, the wall time of sapp.capture on the meta device (nothing is allocated), the
node count, and which path was used.  --direct also times the capture without block replication
(the plain torch.export of every layer) for comparison.  The first capture in a process pays a
one-time torch.export warm-up, so a warm-up capture of gpt-tiny runs first and is not reported."""
from __future__ import annotations

import argparse
import sys
import time

DEFAULT = ["gpt3-125m", "gpt3-1.3b", "gpt3-13b", "gpt3-175b", "bert-large", "resnet50", "wide-deep"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=DEFAULT)
    ap.add_argument("--direct", action="store_true", help="also time capture without block replication")
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args(argv)

    import sapp.models as M
    from sapp.capture import capture

    t = time.perf_counter()
    capture(M.get("gpt-tiny"), batch=2)
    print(f"warm-up (first export in process): {time.perf_counter() - t:.2f} s")
    print(f"{'model':<14} {'layers':>6} {'nodes':>6} {'capture_s':>10} {'path':<18} {'direct_s':>9}")
    for name in args.names:
        model = M.get(name)
        t = time.perf_counter()
        g = capture(model, batch=args.batch)
        took = time.perf_counter() - t
        direct = ""
        if args.direct and g.meta["capture"] != "export":
            t = time.perf_counter()
            capture(model, batch=args.batch, fast=False)
            direct = f"{time.perf_counter() - t:9.2f}"
        print(f"{name:<14} {len(g.blocks):>6} {len(g):>6} {took:>10.2f} {g.meta['capture']:<18} {direct:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
