"""Joint search quality: `python -m bench.joint_exhaustive [--quick]`.

For zoo models x {8, 64, 512} devices, the joint search's predicted step time against an exhaustive
enumeration of (pp, dp, tp, micro-batches, schedule, uniform recompute policy, ZeRO) over the same
cost model and the same stage profiles (`exhaustive_search` below).  gap = search / best - 1
(<= 1% is the target; negative when mixing recompute policies per block beats every uniform policy).
`optimum(model, cluster, global_batch)` is what bench/run.py calls.

The enumeration is the search's own (`enumerate_configs`): interleaving with every v that divides the
blocks (v = 2 .. L / pp) and stage partitions with uneven block counts are in it.  PINNED cases add
what only pins reach: a v that does not divide the blocks (chunks of different sizes, priced by the
schedule simulator) and micro-batch counts that are not a multiple of pp (torch's flex
interleaving).  Each line says how many interleaved configurations the exhaustive side scored and
whether the winner's stages hold different block counts."""
from __future__ import annotations

import argparse
import sys
import time

CASES = [("gpt3-1.3b", 512), ("bert-large", 1024), ("resnet50", 1024), ("gpt3-6.7b", 1024),
         ("gpt3-1.3b", 8),          # 8 sequences: more devices than samples, context parallelism searched
         ("mixtral-8x7b", 256)]     # MoE: expert parallelism (ep) is a searched dimension
# --all: every zoo model of the benchmark set (the tiny test models aside)
ALL_CASES = CASES + [("gpt3-13b", 1024), ("gpt3-175b", 1536), ("mlp", 4096), ("wide-deep", 16384)]
DEVICES = (8, 64, 512)
# (model, global batch, devices, pins): interleaving only pins reach
PINNED = [("gpt3-1.3b", 512, 64, {"virtual_chunks": 5, "pp": 4}),            # 24 blocks: 6 per stage, chunks 1-2
          ("gpt3-1.3b", 768, 64, {"virtual_chunks": 3, "pp": 4, "micro_batches": 6}),   # m = 6 over 4 stages
          ("gpt3-6.7b", 1024, 64, {"schedule": "interleaved", "pp": 8})]
MAX_CONFIGS = 4000          # beyond this the exhaustive enumeration takes minutes: skipped
_GRAPHS = {}


def _graph(model):
    key = id(model)
    if key not in _GRAPHS:
        from sapp.api import capture_graph
        _GRAPHS[key] = (model, capture_graph(model)[0])
    return _GRAPHS[key][1]


def exhaustive_search(graph, cluster, *, global_batch, constraints=None, settings=None, search_fn=None,
                      policies=None, exact_partition=True):
    """Reference for the quality benchmark: every configuration x every uniform recompute policy,
    no pruning, same cost model and stage profiles, exact partition (the O(p n^2) DP, or with
    exact_partition=False the count bisection, which tests/test_pipeline_partition.py checks equal
    to the DP for identical blocks).  Returns the best JointResult (or None) and the number of
    (configuration, policy) pairs scored."""
    from sapp.constraints import Constraints
    from sapp.costmodel import CostSettings
    from sapp.recompute.solver import POLICIES
    from sapp.search.joint import SearchContext, enumerate_configs, evaluate_config
    from sapp.search.joint.placement import rank_key
    policies = POLICIES if policies is None else policies
    cons = Constraints.from_dict(constraints)
    ctx = SearchContext(graph, cluster, int(global_batch), cons, settings or CostSettings(), search_fn)
    best, scored = None, 0
    exhaustive_search.interleaved = 0
    for cfg in enumerate_configs(ctx):
        exhaustive_search.interleaved += cfg.schedule == "interleaved"
        prof = ctx.profile(cfg.dp_cp, cfg.tp, cfg.sp)     # a cp configuration prices on dp·cp's profile
        for pol in policies:
            scored += 1
            res = evaluate_config(ctx, cfg, prof, exact=exact_partition, policy=pol)
            if res is not None and (best is None or rank_key(res) < rank_key(best)):
                best = res
    return best, scored


def optimum(model, cluster, *, global_batch, constraints=None):
    """Exhaustive optimum as {"step_time_s", "config"}, or None when the case is too large."""
    from sapp.constraints import Constraints
    from sapp.costmodel import CostSettings
    from sapp.search.joint import SearchContext, enumerate_configs
    from sapp.api import tp_search_fn
    graph = _graph(model) if not hasattr(model, "nodes") else model
    settings = CostSettings(precision=cluster.precision)
    ctx = SearchContext(graph, cluster, int(global_batch), Constraints.from_dict(constraints), settings, None)
    if len(enumerate_configs(ctx)) > MAX_CONFIGS:
        return None
    # the same stage profiles sapp.search prices: its tp level in the form DTensor runs
    best, scored = exhaustive_search(graph, cluster, global_batch=global_batch, constraints=constraints,
                                     settings=settings, search_fn=tp_search_fn(), exact_partition=False)
    if best is None:
        return None
    counts = sorted({len(s.blocks) for s in best.stages})
    return {"step_time_s": best.step_time_s, "config": best.config.describe(), "scored": scored,
            "interleaved": exhaustive_search.interleaved, "uneven": len(counts) > 1}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 and 64 devices only")
    ap.add_argument("--all", action="store_true", help="every zoo model of the benchmark set")
    ap.add_argument("--no-pinned", action="store_true", help="leave out the PINNED interleaving cases")
    args = ap.parse_args(argv)
    import sapp.models as zoo
    from sapp.cluster import Cluster
    from sapp.errors import SappError
    from sapp.api import tp_search_fn
    from sapp.costmodel import CostSettings
    from sapp.search.joint import joint_search

    print(f"{'model':<11} {'devices':>7} {'search_s':>8} {'exhaustive_s':>12} {'scored':>7} {'interl':>6} "
          f"{'search_step':>11} {'best_step':>10} {'gap':>8}  configurations (search | exhaustive)")
    gaps = []
    runs = [(name, batch, n, None) for name, batch in (ALL_CASES if args.all else CASES)
            for n in (DEVICES[:2] if args.quick else DEVICES)] + ([] if args.no_pinned else PINNED)
    for name, batch, n, pins in runs:
        g = _graph(zoo.get(name))
        cl = Cluster.parse(f"a100-80g:devices={n}")
        label = name if pins is None else f"{name} {pins}"
        t0 = time.perf_counter()
        try:
            r = joint_search(g, cl, global_batch=batch, constraints=pins,
                             settings=CostSettings(precision=cl.precision), search_fn=tp_search_fn())
        except SappError as e:
            print(f"{label:<11} {n:>7}  search: {e}")
            continue
        ts = time.perf_counter() - t0
        t0 = time.perf_counter()
        ex = optimum(g, cl, global_batch=batch, constraints=pins)
        te = time.perf_counter() - t0
        if ex is None:
            print(f"{label:<11} {n:>7} {ts:>8.2f} {'skipped':>12}")
            continue
        gap = r.step_time_s / ex["step_time_s"] - 1
        gaps.append(gap)
        print(f"{label:<11} {n:>7} {ts:>8.2f} {te:>12.2f} {ex['scored']:>7} {ex['interleaved']:>6} "
              f"{r.step_time_s:>11.4f} {ex['step_time_s']:>10.4f} {gap:>+8.3%}  {r.config.describe()} | "
              f"{ex['config']}{' (uneven stages)' if ex['uneven'] else ''}")
        sys.stdout.flush()
    if gaps:
        print(f"\nworst gap {max(gaps):+.3%} over {len(gaps)} cases (target <= +1%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
