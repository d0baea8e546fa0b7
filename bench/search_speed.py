"""Sharding-search speed: `python -m bench.search_speed [--hand] [--repeat N]`.

Headline: GPT-3 175B (96 layers, captured from the zoo; --hand uses the hand-built GPT graph of
bench.random_graphs instead) on 1024 A100-80G devices (Mesh.for_devices(cluster, 1024): 7
inter-node + 3 intra-node levels), recursive sharding search, target <= 2 s on a 2-core machine.
Then the scaling over layers (12/24/48/96 at 1024 devices) and devices (8..4096 at 96 layers).
Times are the median of --repeat runs of shard_search (graph capture excluded, printed apart)."""
from __future__ import annotations

import argparse
import statistics
import sys
import time

TARGET_S = 2.0


def build_graph(layers, batch, hand):
    t = time.perf_counter()
    if hand:
        from bench.random_graphs import gpt_graph
        g = gpt_graph(layers=layers, b=batch, s=2048, h=12288, a=96, vocab=51200, name=f"gpt3-175b-hand-l{layers}")
    else:
        import sapp.models as M
        from sapp.capture import capture
        g = capture(M.get("gpt3-175b", l=layers), batch=batch)
    return g, time.perf_counter() - t


def time_search(g, devices, repeat):
    from sapp.cluster import PRESETS
    from sapp.cluster.mesh import Mesh
    from sapp.search import shard_search
    cl = PRESETS["a100-80g"].replace(nodes=max(1, devices // 8), gpus_per_node=min(8, devices))
    mesh = Mesh.for_devices(cl, devices)
    times, res = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        res = shard_search(g, mesh, cl)
        times.append(time.perf_counter() - t)
    return statistics.median(times), res, mesh


def main(argv=None, out=sys.stdout):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hand", action="store_true", help="hand-built GPT graph instead of the captured zoo model")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1536, help="global batch (GPT-3 paper: 1536)")
    args = ap.parse_args(argv)
    hand = args.hand
    if not hand:
        try:
            import sapp.capture  # noqa: F401
            import sapp.models  # noqa: F401
        except ImportError:
            hand = True
    graphs = {}
    for layers in (12, 24, 48, 96):
        graphs[layers] = build_graph(layers, args.batch, hand)
    g96, cap_s = graphs[96]
    src = "hand-built" if hand else "captured"
    t, res, mesh = time_search(g96, 1024, args.repeat)
    print(f"GPT-3 175B ({src}, {len(g96)} ops, batch {args.batch}) on 1024 a100-80g devices "
          f"({len(mesh.levels)} mesh levels): sharding search {t:.2f} s "
          f"(target <= {TARGET_S:.0f} s: {'met' if t <= TARGET_S else 'MISSED'}); graph build {cap_s:.2f} s; "
          f"predicted step {res.cost.step_time_s:.2f} s", file=out)
    print(f"\n{'layers':>6} {'ops':>6} {'devices':>7} {'levels':>6} {'search_s':>9}", file=out)
    for layers in (12, 24, 48, 96):
        g, _ = graphs[layers]
        t, _, mesh = time_search(g, 1024, args.repeat)
        print(f"{layers:>6} {len(g):>6} {1024:>7} {len(mesh.levels):>6} {t:>9.3f}", file=out, flush=True)
    print(file=out)
    for devices in (8, 64, 512, 1024, 4096):
        t, _, mesh = time_search(g96, devices, args.repeat)
        print(f"{96:>6} {len(g96):>6} {devices:>7} {len(mesh.levels):>6} {t:>9.3f}", file=out, flush=True)


if __name__ == "__main__":
    main()
