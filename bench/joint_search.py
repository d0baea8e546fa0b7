"""Joint search speed: `python -m bench.joint_search [--only NAME]`.

Prints, per case, the capture time (separately: it is done once per model) and the joint search time
(pp x dp x tp x micro-batches x schedule x recompute x ZeRO on top of the per-stage sharding search),
with the chosen configuration, predicted step time, MFU and peak memory vs capacity.  Target: the
GPT-175B / 1024-device joint search <= 5 s on a 2-core machine."""
from __future__ import annotations

import argparse
import sys
import time

CASES = [
    # model, global batch, cluster spec
    ("gpt3-175b", 1536, "a100-80g:nodes=128"),
    ("gpt3-1.3b", 512, "a100-80g:nodes=1"),
    ("gpt3-6.7b", 1024, "a100-80g:nodes=8"),
    ("bert-large", 1024, "a100-80g:nodes=8"),
    ("resnet50", 256, "a100-80g:nodes=1"),
    ("resnet50", 2048, "a100-80g:nodes=8"),
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run only cases whose model name contains this")
    args = ap.parse_args(argv)
    import sapp.models as zoo
    from sapp.api import capture_graph
    from sapp.cluster import Cluster
    from sapp.search.joint import joint_search
    from sapp.units import fmt_bytes

    capture_graph(zoo.get("gpt-tiny"))           # one-time torch.export warm-up, not reported
    graphs = {}
    print(f"{'model':<11} {'devices':>7} {'batch':>5} {'capture_s':>9} {'search_s':>8} {'evaluated':>9} "
          f"{'configuration':<48} {'step_s':>8} {'MFU':>6} {'peak/capacity':>20}")
    worst = 0.0
    for name, batch, spec in CASES:
        if args.only and args.only not in name:
            continue
        cap_s = 0.0
        if name not in graphs:
            graphs[name], cap_s = capture_graph(zoo.get(name))
        cl = Cluster.parse(spec)
        t0 = time.perf_counter()
        r = joint_search(graphs[name], cl, global_batch=batch)
        dt = time.perf_counter() - t0
        if name == "gpt3-175b":
            worst = dt
        print(f"{name:<11} {cl.devices:>7} {batch:>5} {cap_s:>9.2f} {dt:>8.2f} {r.stats['evaluated']:>9} "
              f"{r.config.describe():<48} {r.step_time_s:>8.3f} {r.mfu:>6.1%} "
              f"{fmt_bytes(r.peak_memory_bytes):>9} / {fmt_bytes(cl.device_memory):>8}")
        sys.stdout.flush()
    if worst:
        print(f"\nGPT-175B on 1024 devices: joint search {worst:.2f} s (target <= 5 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
