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
    ranked = sorted(((analytic_bound(ctx, c), c.key(), c) for c in configs), key=lambda t: t[:2])
    best, evaluated, pruned = None, 0, 0
    feasible_seen = []
    closest = None            # (memory needed, config) of the best infeasible attempt
    for lb, _, cfg in ranked:
        if best is not None and not exhaustive and lb > best.step_time_s:
            pruned += 1
            continue
        prof = ctx.profile(cfg.dp, cfg.tp, cfg.sp)
        if best is not None and not exhaustive and profile_bound(ctx, cfg, prof) > best.step_time_s:
            pruned += 1
            continue
        evaluated += 1
        res = evaluate_config(ctx, cfg, prof)
        if progress is not None:
            progress(evaluated, len(ranked))
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
    best.stats = {"configs": len(configs), "evaluated": evaluated, "pruned": pruned,
                  "profiles": len(ctx.profiles), "searches": len(ctx.strategy_cache),
                  "search_s": time.perf_counter() - t0}
    best.capacity_bytes = cluster.usable_memory
    best.notes = notes(ctx, best)
    best.alternatives = _alternatives(best, feasible_seen)
    return best


def _alternatives(best, seen, k=5):
    """The next-best evaluated configurations (one per pp/dp/tp/schedule), for `sapp explain`."""
    out, keys = [], {(best.config.pp, best.config.dp, best.config.tp, best.config.schedule, best.config.sp)}
    for r in sorted(seen, key=rank_key):
        c = r.config
        key = (c.pp, c.dp, c.tp, c.schedule, c.sp)
        if key in keys:
            continue
        keys.add(key)
        pol = {}
        for s in r.stages:
            for v in s.recompute.values():
                pol[v] = pol.get(v, 0) + 1
        out.append({"parallel": {"dp": c.dp, "tp": c.tp, "pp": c.pp, "sp": c.sp}, "schedule": c.schedule,
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
