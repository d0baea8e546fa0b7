"""The branch-and-bound driver: configurations in bound order, profiles on first use, exact evaluation
of the survivors."""
from __future__ import annotations

import math
import time

from ...constraints import Constraints
from ...costmodel import CostSettings
from ...errors import ConstraintError, InfeasibleError, SappError
from ...units import fmt_bytes
from .bounds import analytic_bound, profile_bound
from .configs import enumerate_configs
from .context import SearchContext
from .notes import notes
from .placement import evaluate_config, rank_key
from .stage import memory_needed


def joint_search(graph, cluster, *, global_batch, constraints=None, settings=None, search_fn=None,
                 progress=None, exhaustive=False, ignore_capacity=False, fixed_strategies=None) -> JointResult:
    """Best feasible configuration.  Raises InfeasibleError (one line: the smallest per-device memory
    that would fit and the best configuration tried) when nothing fits."""
    t0 = time.perf_counter()
    cons = Constraints.from_dict(constraints)
    settings = settings or CostSettings()
    if global_batch is None or global_batch < 1:
        raise SappError(f"global batch must be a positive integer, got {global_batch!r}")
    ctx = SearchContext(graph, cluster, int(global_batch), cons, settings, search_fn)
    ctx.fixed = fixed_strategies
    if ignore_capacity:            # evaluate a pinned plan even if it does not fit (reported, not refused)
        ctx.cap = math.inf
    cons.check(cluster.devices, cluster.gpus_per_node, ctx.block_names, global_batch)
    configs = enumerate_configs(ctx)
    if not configs:
        raise ConstraintError(f"no (pp, dp, tp, micro-batch) combination fits {cluster.devices} devices with global "
                              f"batch {global_batch} under the constraints; relax them or change the batch")
    best, evaluated, pruned = None, 0, 0
    feasible_seen = []
    closest = None            # (memory needed, config) of the best infeasible attempt
    cutoff = (lambda: math.inf) if exhaustive else (lambda: best.step_time_s if best is not None else math.inf)
    for lb, cfg in _best_first(ctx, configs, cutoff):
        if lb > cutoff():
            continue
        prof = ctx.profile(cfg.dp_cp, cfg.tp)      # a cp configuration shares dp·cp's profile
        evaluated += 1
        res = evaluate_config(ctx, cfg, prof)
        if progress is not None:
            progress(evaluated, len(configs))
        if res is None:
            need = memory_needed(ctx, cfg, prof)
            if closest is None or need < closest[0]:
                closest = (need, cfg)
            continue
        feasible_seen.append(res)
        if best is None or rank_key(res) < rank_key(best):
            best = res
    if best is None:
        need, cfg = closest
        raise InfeasibleError(
            f"no configuration fits {fmt_bytes(ctx.cap)} per device {_tried(cons)}; "
            f"the closest ({cfg.describe()}) needs {fmt_bytes(need)} per device: use devices with more "
            f"memory, more devices, or a smaller batch", needed_bytes=need, capacity_bytes=ctx.cap, best=cfg)
    pruned = len(configs) - evaluated
    best.stats = {"configs": len(configs), "evaluated": evaluated, "pruned": pruned,
                  "profiles": len(ctx.profiles), "searches": len(ctx.strategy_cache),
                  "search_s": time.perf_counter() - t0}
    best.capacity_bytes = cluster.usable_memory
    best.notes = notes(ctx, best)
    best.alternatives = _alternatives(best, feasible_seen)
    return best


def _best_first(ctx, configs, cutoff):
    """(lower bound, config) in increasing order of the best bound known, computed lazily: a
    configuration first enters with its analytic bound; when it comes up, its profile bound (the
    real per-micro-batch unit times) replaces it, and it is yielded once that bound is the smallest
    left.  Every configuration whose analytic bound is below the best profile bound gets its
    profile bound before any exact evaluation, so the evaluations start near the optimum and the
    branch and bound prunes the rest (the analytic bound alone is several times below real step
    times on large models: on Llama-3-405B it let hundreds of configurations through).  The yielded
    bounds never decrease: once the smallest is above `cutoff()` (the best step found) the rest is
    pruned unseen.  Ties are broken by Config.key (deterministic)."""
    import heapq
    heap = [(analytic_bound(ctx, c), 0, c.key(), i) for i, c in enumerate(configs)]
    heapq.heapify(heap)
    while heap:
        lb, refined, key, i = heapq.heappop(heap)
        if lb > cutoff():
            return
        cfg = configs[i]
        if refined:
            yield lb, cfg
            continue
        pb = profile_bound(ctx, cfg, ctx.profile(cfg.dp_cp, cfg.tp))
        heapq.heappush(heap, (max(lb, pb), 1, key, i))


def _alternatives(best, seen, k=5):
    """The next-best evaluated configurations (one per pp/dp/tp/schedule), for `sapp explain`."""
    out, keys = [], {(best.config.pp, best.config.dp, best.config.tp, best.config.schedule, best.config.cp,
                      best.config.ep)}
    for r in sorted(seen, key=rank_key):
        c = r.config
        key = (c.pp, c.dp, c.tp, c.schedule, c.cp, c.ep)
        if key in keys:
            continue
        keys.add(key)
        pol = {}
        for s in r.stages:
            for v in s.recompute.values():
                pol[v] = pol.get(v, 0) + 1
        par = {"dp": c.dp, "tp": c.tp, "pp": c.pp, **({"cp": c.cp} if c.cp > 1 else {}),
               **({"ep": c.ep} if c.ep > 1 else {})}
        out.append({"parallel": par, "schedule": c.schedule,
                    "micro_batches": c.m, "virtual_chunks": c.v, "zero": c.zero,
                    "recompute": max(sorted(pol), key=lambda x: pol[x]) if pol else "none",
                    "predicted": {"step_time_s": r.step_time_s, "peak_memory_bytes": r.peak_memory_bytes},
                    "feasible": True})
        if len(out) >= k:
            break
    return out


def _tried(cons):
    """What the infeasible message may claim was tried: only what the pins left free."""
    rec = ("even with full recomputation" if cons.recompute is None
           else f"with recomputation pinned to {cons.recompute!r}")
    zero = " and ZeRO-3" if cons.zero is None else f" at ZeRO-{cons.zero}"
    return rec + zero
