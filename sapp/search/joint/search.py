"""The branch-and-bound driver: configurations in bound order, profiles on first use, exact evaluation
of the survivors."""
from __future__ import annotations

import bisect
import heapq
import inspect
import math
import time
from dataclasses import dataclass

from sapp.search.constraints import Constraints
from ...costmodel import CostSettings
from ...errors import ConstraintError, InfeasibleError, SappError
from ...units import fmt_bytes, fmt_time
from .bounds import analytic_bound, profile_bound
from .configs import batch_stats_problem, dualpipev_why, host_pinned, enumerate_configs, interleave_problem
from .memory_bound import stage_time_floor
from .context import SearchContext
from .notes import notes
from .evaluate import tp_shards
from .placement import evaluate_config, host_offload_possible, rank_key
from .memory_bound import memory_needed


def joint_search(graph, cluster, *, global_batch, constraints=None, settings=None, search_fn=None,
                 progress=None, exhaustive=False, ignore_capacity=False, fixed_strategies=None,
                 skip=None, caches=None, cutoff=None, fits=None) -> JointResult:
    """Best feasible configuration.  Raises InfeasibleError (one line: the smallest per-device memory
    that would fit and the best configuration tried) when nothing fits.  `skip(config)`: configurations
    ruled out beforehand (those the emitter cannot run for this model: sapp/emit/runnable.py).  `caches`: a
    dict the caller keeps across searches of this graph, cluster, settings and search_fn at other
    global batches, for what does not depend on the batch (context._shared).  `cutoff`: a step time the
    caller only needs beaten: configurations whose bound is above it are pruned unpriced, and the search
    returns None once it proves the best step above the cutoff (or the best plan, where it priced that
    before its bounds passed the cutoff).  At or below the cutoff it returns the plan it would return
    without one: a bound above the cutoff is above that plan's step too.  `fits(result)`: a further
    test a priced configuration must pass (an engine's own memory estimate, sapp/engines/estimate_fit.py);
    one that fails is priced once more with selective recomputation on every block (what such estimates
    assume) and otherwise counts as not fitting.  It only removes plans, so every bound stays valid."""
    t0 = time.perf_counter()
    cons = Constraints.from_dict(constraints)
    settings = settings or CostSettings()
    if global_batch is None or global_batch < 1:
        raise SappError(f"global batch must be a positive integer, got {global_batch!r}")
    ctx = SearchContext(graph, cluster, int(global_batch), cons, settings, search_fn, caches)
    ctx.fixed = fixed_strategies
    if ignore_capacity:            # evaluate a pinned plan even if it does not fit (reported, not refused)
        ctx.cap = math.inf
    cons.check(cluster.devices, cluster.gpus_per_node, ctx.block_names, global_batch)
    configs = _configs(ctx, global_batch, skip)
    bb = _branch_and_bound(ctx, configs, progress, exhaustive, cutoff, fits)
    if bb.cut and (bb.best is None or bb.best.step_time_s > cutoff):
        if bb.idle and bb.best is None:            # idle tp is priced only when nothing else fits: unknown here
            return joint_search(graph, cluster, global_batch=global_batch, constraints=cons, settings=settings,
                                search_fn=search_fn, progress=progress, exhaustive=exhaustive,
                                ignore_capacity=ignore_capacity,
                                fixed_strategies=fixed_strategies, skip=skip, caches=caches, fits=fits)
        return None
    for cfg, prof in bb.idle if bb.best is None else ():
        bb.evaluated += 1
        res = _passing(ctx, cfg, prof, evaluate_config(ctx, cfg, prof), fits)
        if res is None:
            bb.infeasible.append((cfg, prof))
        elif bb.best is None or rank_key(res) < rank_key(bb.best):
            bb.feasible_seen.append(res)
            bb.best = res
    best = bb.best
    if best is None and getattr(ctx, "pin_error", None):
        raise ConstraintError(ctx.pin_error)
    bb.report.done(best)
    if best is None:
        raise _infeasible(ctx, bb.infeasible)
    best.stats = {"configs": len(configs), "evaluated": bb.evaluated, "pruned": len(configs) - bb.evaluated,
                  "profiles": len(ctx.used_profiles),
                  # (the tp searches, not the SP layouts derived from them: pipeline/profile.stage_strategies)
                  "searches": sum(1 for k in ctx.strategy_cache if k[0] == "tp"),
                  "search_s": time.perf_counter() - t0}
    best.capacity_bytes = cluster.usable_memory
    best.notes = notes(ctx, best)
    best.alternatives = _alternatives(best, bb.feasible_seen)
    return best


def _configs(ctx, global_batch, skip) -> list:
    """The configurations the constraints leave, less those `skip` rules out; ConstraintError, in one
    line, where none is left."""
    cons, cluster = ctx.cons, ctx.cluster
    configs = enumerate_configs(ctx)
    if skip is not None:
        configs = [c for c in configs if not skip(c)]
    if not configs and batch_stats_problem(ctx):
        raise ConstraintError(batch_stats_problem(ctx))
    if not configs and interleave_problem(ctx):
        raise ConstraintError(interleave_problem(ctx))
    if not configs and dualpipev_why(ctx):
        raise ConstraintError(dualpipev_why(ctx))
    if not configs:
        raise ConstraintError(f"no (pp, dp, tp, micro-batch) combination fits {cluster.devices} devices with global "
                              f"batch {global_batch} under the constraints"
                              + (" (host placement pins rule out context parallelism)" if host_pinned(cons) else "")
                              + "; relax them or change the batch")
    return configs


@dataclass
class _Walk:
    """Where the branch and bound stopped."""
    best: object                # the best JointResult priced, or None
    evaluated: int              # configurations priced
    idle: list                  # (config, profile) of tp levels that shard nothing, not priced yet
    feasible_seen: list         # the results that fit (for the alternatives)
    infeasible: list            # (config, profile) that did not fit (for the message)
    cut: bool                   # stopped by the cutoff
    report: "_Report"


def _branch_and_bound(ctx, configs, progress, exhaustive, cutoff, fits) -> _Walk:
    # Best-first branch and bound: a configuration first enters with its analytic bound; popped, it
    # gets its profile bound (its (dp, tp) profile built on first use) and goes back; popped again
    # it is evaluated.  Configurations are thus evaluated in profile-bound order, so the optimum is
    # met early and the rest pruned; every bound is a valid lower bound, so the optimum (and the
    # plan) is what evaluating every configuration would give.  A third look (identical blocks)
    # adds the recomputation the memory forces before evaluating.  `exhaustive` evaluates them all.
    ranked = sorted(((analytic_bound(ctx, c), c.key(), c) for c in configs), key=lambda t: t[:2])
    heap = [(lb, 0, key, i) for i, (lb, key, _) in enumerate(ranked)]
    # tp left free: a tp level that shards nothing (every tp rank computes the whole model) spends
    # devices dp or pp could use: evaluated only when no other configuration fits (a pinned tp stays)
    skip_idle_tp = ctx.cons.tp is None and any(c.tp == 1 for c in configs)
    w = _Walk(None, 0, [], [], [], False, _Report(progress, [t[0] for t in ranked], exhaustive))
    report = w.report
    while heap:
        lb, phase, _, i = heapq.heappop(heap)
        cfg = ranked[i][2]
        best = w.best
        if cutoff is not None and lb > cutoff and (best is None or best.step_time_s > cutoff):
            w.cut = True                       # nothing left is at or below the cutoff
            break
        if best is not None and not exhaustive and lb > best.step_time_s:
            break                              # the heap is ordered: nothing left can beat `best`
        n_prof = len(ctx.used_profiles)
        prof = ctx.profile(cfg.dp_cp, cfg.tp, cfg.sp)      # a cp configuration shares dp·cp's profile
        if len(ctx.used_profiles) > n_prof:
            report.profile(len(ctx.used_profiles), best, lb)
        if skip_idle_tp and cfg.tp > 1 and not tp_shards(prof):
            w.idle.append((cfg, prof))
            continue
        if phase == 0 and not exhaustive:
            heapq.heappush(heap, (max(lb, profile_bound(ctx, cfg, prof)), 1, cfg.key(), i))
            continue
        if not exhaustive and phase == 1:
            # third look: the recomputation its memory forces (memory_bound; infinite where no partition
            # fits beside the states: pruned unpriced); evaluated when popped again
            floor = stage_time_floor(ctx, cfg, prof, host_offload_possible(ctx, cfg, prof))
            if floor == math.inf:
                w.infeasible.append((cfg, prof))
                report.decided(i, best, lb)
                continue
            if floor is not None:
                heapq.heappush(heap, (max(lb, profile_bound(ctx, cfg, prof, floor)), 2, cfg.key(), i))
                continue
        w.evaluated += 1
        res = _passing(ctx, cfg, prof, evaluate_config(ctx, cfg, prof), fits)
        if res is not None:
            w.feasible_seen.append(res)
            if w.best is None or rank_key(res) < rank_key(w.best):
                w.best = res
        report.decided(i, w.best, lb)
        if res is None:
            w.infeasible.append((cfg, prof))     # priced for the message only if nothing fits
            continue
        w.feasible_seen.append(res)
        if w.best is None or rank_key(res) < rank_key(w.best):
            w.best = res
    return w


def _infeasible(ctx, infeasible) -> InfeasibleError:
    """Nothing fits: the smallest per-device memory that would, and the configuration needing it."""
    closest = None            # (memory needed, config) of the best infeasible attempt
    for cfg, prof in infeasible:
        need = memory_needed(ctx, cfg, prof)
        if closest is None or need < closest[0]:
            closest = (need, cfg)
    need, cfg = closest
    return InfeasibleError(
        f"no configuration fits {fmt_bytes(ctx.cap)} per device {_tried(ctx.cons, ctx.settings)}; "
        f"the closest ({cfg.describe()}) needs {fmt_bytes(need)} per device: use devices with more "
        f"memory, more devices, or a smaller batch", needed_bytes=need, capacity_bytes=ctx.cap, best=cfg)


def _passing(ctx, cfg, prof, res, fits):
    """`res` where it passes `fits`; else the configuration with selective recomputation on every block
    (when the constraints leave recomputation free) where that passes; else None."""
    if res is None or fits is None or fits(res):
        return res
    if ctx.cons.recompute is not None:
        return None
    alt = evaluate_config(ctx, cfg, prof, policy="selective")
    return alt if alt is not None and fits(alt) else None


class _Report:
    """What the progress callback sees: `progress(done, total)`, in thousandths of the search, and a note
    as third argument where the callback takes one (report.Progress).  Configurations are priced in the
    order of their lower bounds and the search ends when the bound reaches the best step found, so the
    work done is the gap closed between the bound (when the first plan was priced) and the best step;
    it reads 0 while the first stage profiles are built and 1000 at the end.  The note counts the
    profiles, the best step, the bound and the configurations decided (evaluated, ruled out by memory or
    bounded above the best)."""
    TOTAL = 1000

    def __init__(self, progress, bounds, exhaustive):
        self.fn, self.bounds, self.n, self.exhaustive = progress, bounds, len(bounds), exhaustive
        self.seen = set()           # indices evaluated or ruled out
        self.base = None            # the bound when the first plan was priced
        self.done_ = 0
        self.with_note = False
        if progress is not None:
            try:
                inspect.signature(progress).bind(0, 0, "")
                self.with_note = True
            except (TypeError, ValueError):
                pass
        self._send(f"{self.n} configurations")

    def _send(self, note):
        if self.fn is not None:
            self.fn(self.done_, self.TOTAL, note) if self.with_note else self.fn(self.done_, self.TOTAL)

    def _decided(self, best):
        if best is None or self.exhaustive:
            return len(self.seen)
        cut = best.step_time_s        # analytic bounds above it: popped only after the cut, never evaluated
        above = self.n - bisect.bisect_right(self.bounds, cut)
        return len(self.seen) + above - sum(1 for i in self.seen if self.bounds[i] > cut)

    def _update(self, best, lb, head=""):
        if self.exhaustive:
            self.done_ = self.TOTAL * len(self.seen) // max(self.n, 1)
        elif best is not None:
            if self.base is None:
                self.base = lb
            gap = best.step_time_s - self.base
            frac = 1.0 if gap <= 0 else (lb - self.base) / gap
            self.done_ = max(self.done_, min(self.TOTAL - 1, int(self.TOTAL * frac)))
        state = (f"best {fmt_time(best.step_time_s)}, bound {fmt_time(lb)}; " if best is not None else "")
        self._send(f"{head}{state}{self._decided(best)}/{self.n} configurations decided")

    def profile(self, n, best, lb):
        if self.fn is not None:
            self._update(best, lb, f"{n} stage profiles; ")

    def decided(self, i, best, lb):
        if self.fn is not None:
            self.seen.add(i)
            self._update(best, lb)

    def done(self, best):
        self.done_ = self.TOTAL
        self._send(f"best {fmt_time(best.step_time_s)}; building the plan" if best is not None else "nothing fits")


def _alternatives(best, seen, k=5):
    """The next-best evaluated configurations (one per pp/dp/tp/schedule), for `sapp explain`."""
    out, keys = [], {(best.config.pp, best.config.dp, best.config.tp, best.config.schedule, best.config.cp,
                      best.config.ep, best.config.sp)}
    for r in sorted(seen, key=rank_key):
        c = r.config
        key = (c.pp, c.dp, c.tp, c.schedule, c.cp, c.ep, c.sp)
        if key in keys:
            continue
        keys.add(key)
        pol = {}
        for s in r.stages:
            for v in s.recompute.values():
                pol[v] = pol.get(v, 0) + 1
        par = {"dp": c.dp, "tp": c.tp, "pp": c.pp, "sp": c.sp, **({"cp": c.cp} if c.cp > 1 else {}),
               **({"ep": c.ep} if c.ep > 1 else {})}
        out.append({"parallel": par, "schedule": c.schedule,
                    "micro_batches": c.m, "virtual_chunks": c.v, "zero": c.zero,
                    "recompute": max(sorted(pol), key=lambda x: pol[x]) if pol else "none",
                    "predicted": {"step_time_s": r.step_time_s, "peak_memory_bytes": r.peak_memory_bytes},
                    "feasible": True})
        if len(out) >= k:
            break
    return out


def _tried(cons, settings=None):
    """What the infeasible message may claim was tried: only what the pins (and the MoE overlap, which
    Megatron-Core runs without full recomputation) left free."""
    if getattr(settings, "moe_a2a_overlap", False) and cons.recompute is None:
        rec = "with at most selective recomputation (moe_a2a_overlap: Megatron-Core runs it without full)"
    else:
        rec = ("even with full recomputation" if cons.recompute is None
               else f"with recomputation pinned to {cons.recompute!r}")
    zero = " and ZeRO-3" if cons.zero is None else f" at ZeRO-{cons.zero}"
    return rec + zero
