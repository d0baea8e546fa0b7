"""Re-planning at scale, on paper: `python -m bench.replan_scale [--quick]`.

What `sapp replan` (and `sapp run --elastic`) makes of a job that loses nodes: GPT-3 175B on 128 x 8
A100-80GB (global batch 1536) losing 1, 2 and 8 nodes, and Llama-3-405B (zoo, seq 8192) on 2048 x 8
H100-80GB (global batch 2048 sequences, 16M tokens) losing 1 node.  Each row: the original plan, the
re-plan for the nodes left (or a few nodes fewer, which can be faster: a world of 1,016 A100s admits
no layout for a batch of 1536), both predicted step times and the re-plan's wall time (capture once,
then one search per candidate node count).  --quick: the GPT-3 rows only."""
from __future__ import annotations

import argparse
import sys
import time

CASES = (("gpt3-175b", "a100-80g:nodes=128", 1536, (1, 2, 8)),
         ("llama3-405b", "h100-80g:nodes=2048", 2048, (1,)))


def main(argv=None, out=sys.stdout):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    from sapp.api import capture_spec, search
    from sapp.cluster import Cluster
    from sapp.api.replan import replan, scaled_cluster
    rows = []
    for model, cluster, gb, losses in CASES[:1] if args.quick else CASES:
        _, _, _, graph, _ = capture_spec(model)
        t = time.perf_counter()
        plan = search(graph, Cluster.parse(cluster), global_batch=gb)
        first_s = time.perf_counter() - t
        for lost in losses:
            cl = scaled_cluster(plan, nodes=Cluster.parse(cluster).nodes - lost)
            r = replan(model, plan, cl, graph=graph)
            rows.append((model, cluster, lost, r, first_s))
    print("| model | cluster | nodes lost | original plan | s/step | re-plan | devices used | s/step | change | re-plan s |",
          file=out)
    print("|---|---|---|---|---|---|---|---|---|---|", file=out)
    for model, cluster, lost, r, first_s in rows:
        o, n = r.old, r.new
        lay = lambda d: f"dp{d['parallel']['dp']} tp{d['parallel']['tp']} pp{d['parallel']['pp']} m{d['micro_batches']} z{d['zero']}"
        print(f"| {model} | {cluster} | {lost} | {lay(o)} | {o['step_time_s']:.3f} | {lay(n)} | {n['devices']} of "
              f"{r.available * (o['devices'] // (r.available + lost))} | {n['step_time_s']:.3f} | "
              f"{n['step_time_s'] / o['step_time_s'] - 1:+.1%} | {r.search_s:.1f} |", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
