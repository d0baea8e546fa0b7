"""Joint search quality: `python -m bench.joint_exhaustive [--quick] [--all]`.

For zoo models x {8, 64, 512} devices, the joint search's predicted step time against an exhaustive
reference over the same cost model and stage profiles (`exhaustive_search` below): every
configuration the search's enumeration holds (pp, dp, tp, sp, cp, ep, micro-batches, schedule, v,
ZeRO), each priced with the exact best per-block recompute mix of every stage
(bench/exact_recompute.py: every none / selective / full assignment, independent of the search's own
solver and checked against brute force in tests/test_joint_exhaustive.py).  gap = search / best - 1:
0 is the target both ways (negative would mean the reference misses part of the search's space).
`optimum(model, cluster, global_batch)` is what bench/run.py calls.

The enumeration is the search's own (`enumerate_configs`): sequence parallelism on / off per tp > 1,
context parallelism, expert parallelism (MoE), interleaving with every v that divides the blocks and
stage partitions with uneven block counts are in it.  PINNED cases add what only pins reach: a v that
does not divide the blocks (chunks of different sizes, priced by the schedule simulator) and
micro-batch counts that are not a multiple of pp (torch's flex interleaving).  Each line names the
dimensions the winner uses and its recompute mix."""
from __future__ import annotations

import argparse
import sys
import time

# (model, global batch[, zoo overrides]): seq-len or layer overrides keep a model where its enumeration is
# under MAX_CONFIGS and something fits at 8 devices
CASES = [("gpt3-1.3b", 512), ("bert-large", 1024), ("resnet50", 1024), ("gpt3-6.7b", 1024),
         ("gpt3-1.3b", 8),          # 8 sequences: more devices than samples, context parallelism searched
         ("mixtral-8x7b", 256),     # MoE: expert parallelism (ep) is a searched dimension
         # a Mixtral-shaped MoE that fits on 8 a100-80g (ep at 8 devices): 8 layers, h 2048, 8 experts
         ("mixtral-8x7b", 64, {"l": 8, "h": 2048, "a": 16, "kv": 4, "ffn": 7168, "expert_ffn": 7168,
                               "s": 2048})]
# --all: every zoo model of the benchmark set (the tiny test models aside)
ALL_CASES = CASES + [("gpt3-13b", 1024), ("gpt3-175b", 1536), ("mlp", 4096), ("wide-deep", 16384)]
DEVICES = (8, 64, 512)
# (model, global batch, devices, pins): interleaving only pins reach
PINNED = [("gpt3-1.3b", 512, 64, {"virtual_chunks": 5, "pp": 4}),            # 24 blocks: 6 per stage, chunks 1-2
          ("gpt3-1.3b", 768, 64, {"virtual_chunks": 3, "pp": 4, "micro_batches": 6}),   # m = 6 over 4 stages
          ("gpt3-6.7b", 1024, 64, {"schedule": "interleaved", "pp": 8}),
          ("gpt3-1.3b", 512, 64, {"pp": 16}),                                    # 24 blocks: uneven stages
          # v 4 divides the 24 blocks but not into 4 rows a stage: rows and single blocks both priced
          ("gpt3-1.3b", 512, 64, {"virtual_chunks": 4, "pp": 4})]
MAX_CONFIGS = 5000          # beyond this the exhaustive enumeration takes minutes: skipped
_GRAPHS = {}


def _graph(model):
    key = id(model)
    if key not in _GRAPHS:
        from sapp.api import capture_graph
        _GRAPHS[key] = (model, capture_graph(model)[0])
    return _GRAPHS[key][1]


def exhaustive_search(graph, cluster, *, global_batch, constraints=None, settings=None, search_fn=None,
                      policies=None, exact_partition=True):
    """Reference for the quality benchmark: every configuration, no pruning, same cost model and stage
    profiles.  `policies` None: each stage with its exact best per-block recompute mix
    (bench/exact_recompute.py); a tuple: every uniform policy of it instead (the old, weaker
    reference).  exact_partition: the O(p n^2) DP over stage boundaries; False, the count bisection
    (tests/test_pipeline_partition.py checks it equal to the DP for identical blocks).  Returns the
    best JointResult (or None) and the number of (configuration, policy) evaluations."""
    from sapp.search.constraints import Constraints
    from sapp.costmodel import CostSettings
    from sapp.search.joint import SearchContext, enumerate_configs, evaluate_config
    from sapp.search.joint.placement import rank_key
    from .exact_recompute import exact_evaluator
    cons = Constraints.from_dict(constraints)
    ctx = SearchContext(graph, cluster, int(global_batch), cons, settings or CostSettings(), search_fn)
    best, scored = None, 0
    exhaustive_search.interleaved = 0
    with exact_evaluator() if policies is None else _nothing():
        for cfg in enumerate_configs(ctx):
            exhaustive_search.interleaved += cfg.schedule == "interleaved"
            prof = ctx.profile(cfg.dp_cp, cfg.tp, cfg.sp)     # a cp configuration prices on dp·cp's profile
            for pol in (None,) if policies is None else policies:
                scored += 1
                res = evaluate_config(ctx, cfg, prof, exact=exact_partition, policy=pol)
                if res is not None and (best is None or rank_key(res) < rank_key(best)):
                    best = res
    return best, scored


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def dims(res):
    """What the result uses of the searched dimensions, e.g. 'tp2+sp cp2 ep4 v3 uneven rc=n20/s4/f0'."""
    c = res.config
    out = [f"tp{c.tp}" + ("+sp" if c.sp else "")] if c.tp > 1 else []
    out += [f"cp{c.cp}"] if c.cp > 1 else []
    out += [f"ep{c.ep}"] if c.ep > 1 else []
    out += [f"pp{c.pp}"] if c.pp > 1 else []
    out += [f"v{c.v}"] if c.v > 1 else []
    out += ["uneven"] if len({len(s.blocks) for s in res.stages}) > 1 else []
    pols = [p for s in res.stages for p in s.recompute.values()]
    out.append("rc=n{}/s{}/f{}".format(*(pols.count(p) for p in ("none", "selective", "full"))))
    place = getattr(getattr(res, "placement", None), "name", "device")
    out += [place] if place != "device" else []
    return " ".join(out)


def optimum(model, cluster, *, global_batch, constraints=None):
    """Exhaustive optimum as {"step_time_s", "config", ...}, or None when the case is too large."""
    from sapp.search.constraints import Constraints
    from sapp.costmodel import CostSettings
    from sapp.search.joint import SearchContext, enumerate_configs
    from sapp.api import tp_search_fn
    from .exact_recompute import MIXES
    graph = _graph(model) if not hasattr(model, "nodes") else model
    settings = CostSettings(precision=cluster.precision)
    ctx = SearchContext(graph, cluster, int(global_batch), Constraints.from_dict(constraints), settings, None)
    if len(enumerate_configs(ctx)) > MAX_CONFIGS:
        return None
    mixes0 = MIXES[0]
    # the same stage profiles sapp.search prices: its tp level in the form DTensor runs
    best, scored = exhaustive_search(graph, cluster, global_batch=global_batch, constraints=constraints,
                                     settings=settings, search_fn=tp_search_fn(), exact_partition=False)
    if best is None:
        return None
    counts = sorted({len(s.blocks) for s in best.stages})
    return {"step_time_s": best.step_time_s, "config": best.config.describe(), "scored": scored,
            "interleaved": exhaustive_search.interleaved, "uneven": len(counts) > 1, "dims": dims(best),
            "mixes": MIXES[0] - mixes0}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 and 64 devices only")
    ap.add_argument("--all", action="store_true", help="every zoo model of the benchmark set")
    ap.add_argument("--no-pinned", action="store_true", help="leave out the PINNED interleaving cases")
    ap.add_argument("--only", help="only the cases of these model names (comma-separated)")
    args = ap.parse_args(argv)
    import sapp.models as zoo
    from sapp.cluster import Cluster
    from sapp.errors import SappError
    from sapp.api import tp_search_fn
    from sapp.costmodel import CostSettings
    from sapp.search.joint import joint_search

    print(f"{'model':<11} {'devices':>7} {'search_s':>8} {'exhaustive_s':>12} {'scored':>7} {'mixes':>9} "
          f"{'interl':>6} {'search_step':>11} {'best_step':>10} {'gap':>8}  winner dims (search | exhaustive): "
          f"configurations")
    gaps, totals = [], [0, 0, 0.0]
    runs = [(c[0], c[1], n, None, c[2] if len(c) > 2 else {}) for c in (ALL_CASES if args.all else CASES)
            for n in (DEVICES[:2] if args.quick else DEVICES)]
    runs += [] if args.no_pinned else [(name, b, n, pins, {}) for name, b, n, pins in PINNED]
    t_all = time.perf_counter()
    for name, batch, n, pins, over in runs:
        if args.only and name not in args.only.split(","):
            continue
        g = _graph(zoo.get(name, **over))
        cl = Cluster.parse(f"a100-80g:devices={n}")
        label = (name + ("*" if over else "")) if pins is None else f"{name} {pins}"
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
        totals[0] += ex["scored"]
        totals[1] += ex["mixes"]
        totals[2] += te
        print(f"{label:<11} {n:>7} {ts:>8.2f} {te:>12.2f} {ex['scored']:>7} {ex['mixes']:>9} {ex['interleaved']:>6} "
              f"{r.step_time_s:>11.4f} {ex['step_time_s']:>10.4f} {gap:>+8.3%}  {dims(r)} | {ex['dims']}: "
              f"{r.config.describe()} | {ex['config']}")
        sys.stdout.flush()
    if gaps:
        worst = max(gaps, key=abs)
        print(f"\nlargest |gap| {worst:+.3%} ({worst:+.1e}; max {max(gaps):+.3%}, min {min(gaps):+.3%}) "
              f"over {len(gaps)} cases "
              f"(target 0 both ways); {totals[0]} configurations scored, {totals[1]} recompute-mix states, "
              f"exhaustive {totals[2]:.1f} s, total {time.perf_counter() - t_all:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
