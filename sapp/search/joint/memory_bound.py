"""A lower bound on a configuration's step time that knows its memory: the recomputation a stage
must pay to hold its blocks' activations, priced by the linear relaxation of the recompute choice.

The profile bound (bounds.profile_bound) prices every block without recomputation, so for large
models it sits 20-60% under the evaluated step and the search evaluates hundreds of configurations it
could have ruled out.  Here, for identical blocks: a stage i holding k blocks keeps at least their
model states (parameters only where optimizer offload could move the rest to the host), ZeRO-2's
gathered parameters, its glue and, per micro-batch in flight, its blocks' stashes.  What does not fit
below the capacity must be recomputed; the cheapest way to shave y bytes off a block's stash is at
least the lower convex envelope of its allowed (stash, extra seconds) policies (a fractional choice,
so never above the integer optimum the exact stage pricing finds).  Left out, each only raising the
real time or memory: the recomputation transient, ZeRO-3 gathers, FSDP2 prefetch edges, exposed
host time.  The bottleneck over all whole-block partitions is then found as the exact partition
does (pipeline.partition.partition_counts), on this O(1) stage price.  Where that finds no partition
at all the configuration cannot fit and is pruned unpriced (its stages hold at least their
parameters, their glue and their blocks' least stashes)."""
from __future__ import annotations

import math

from ...pipeline.partition import partition_counts
from ...pipeline.dualpipe import stage_peak
from ...pipeline.schedule import in_flight
from ...recompute.solver import POLICIES
from .interleave import interleave_kmins, interleave_step
from .numbers import bound_numbers, gathered_params, held_states, p2p_time, unit_numbers
from .stage import StageEvaluator, stage_in_flight

REL_TOL = 1e-4


def envelope(points):
    """f(y): the least extra seconds of any fractional mix of `points` [(stash bytes, extra s)] whose
    stash is at most y (None below the smallest stash).  Two points suffice for one constraint."""
    pts = sorted(set(points))
    # per point, the later points it spans (a2 > a1) with e1 - e2 and a2 - a1 computed once: the
    # same floats and the same order of `min` as the plain double loop (it is asked per stage price)
    pre = [(a1, e1, [(a2, e2, e1 - e2, a2 - a1) for a2, e2 in pts[i + 1:] if a2 > a1])
           for i, (a1, e1) in enumerate(pts)]

    def f(y):
        best = None
        for a1, e1, spans in pre:
            if a1 > y:
                break           # (sorted: no later point is below y either)
            best = e1 if best is None else min(best, e1)
            for a2, e2, de, da in spans:
                if y <= a2:
                    e = e2 + de * (a2 - y) / da
                    best = e if best is None else min(best, e)
        return best
    return f


def stage_time_floor(ctx, cfg, prof, offload):
    """A lower bound on the slowest stage's time per micro-batch (one stage: the whole step's per
    micro-batch, glue included), recomputation the memory forces included; math.inf when no partition
    can fit; None where it does not apply (blocks not identical, stage pins, host tables that may
    free memory).
    `offload`: some host placement may move gradients and optimizer states off the device."""
    if not ctx.uniform or ctx.stage_pins is not None or ctx.placement_relevant or not ctx.L:
        return None
    num = unit_numbers(ctx, prof, cfg)
    units = prof.units
    p, m = cfg.pp, cfg.m
    blocks = [j for j, u in enumerate(units) if u.kind == "block"]
    b0 = blocks[0]
    infl = in_flight(cfg.schedule, p, m, cfg.v)
    cap = ctx.cap * (1 + 1e-6)      # (the stage pricing accepts fits within 1e-9 of the capacity: stay looser)

    def states(j):
        st = held_states(units[j], cfg, False, ctx)
        s = st["params"] if offload else st["params"] + st["grads"] + st["optimizer"]
        return s + (num.pbytes[j] if cfg.zero == 2 else 0.0)     # FSDP2's gathered copy (numbers.gathered_params)

    sb = states(b0)
    tb = min(num.t[j] for j in blocks)
    f = envelope([(num.act[b0][POLICIES.index(x)], num.extra[b0][POLICIES.index(x)])
                  for x in ctx.allowed(units[b0].name)])
    pre = list(range(b0))
    post = [j for j in range(blocks[-1] + 1, len(units))]
    c = p2p_time(ctx, cfg, bound_numbers(ctx, prof, cfg).boundary)
    inter = cfg.schedule == "interleaved" and cfg.v > 1
    step = interleave_step(ctx, cfg)
    kmin = interleave_kmins(ctx, cfg) if inter and step == 1 else 1

    dual = cfg.schedule == "dualpipev"

    def sends(i):
        if dual:        # the V (stage.send_counts): none between stages p - 1 and p, none after the last
            return 2 * (2 - (i == 0) - (i == p - 1))
        if inter:
            return 2 * cfg.v - (1 if i == p - 1 else 0) - (1 if i == 0 else 0)
        return (1 if i < p - 1 else 0) + (1 if i > 0 else 0)

    glue = []
    for i in range(p):
        g = (pre if i == 0 else []) + (post if i == (0 if dual else p - 1) else [])    # dualpipev: both on rank 0
        ga = sum(num.act[j][0] for j in g)
        # an interleaved last stage holds its head + loss for one micro-batch (stage.tail_act): its
        # stash is taken from the capacity once, not per micro-batch in flight (dualpipev: rank 0 holds it,
        # the model's last stage, dualpipe.stage_peak = 1 micro-batch in torch's order)
        once = sum(num.act[j][0] for j in post) if (inter and i == p - 1) or (dual and i == 0) else 0.0
        glue.append((sum(states(j) for j in g) + once, ga - once, sum(num.t[j] for j in g)))
    memo = {}

    def stage(i, k):
        k *= step
        gs, ga, gt = glue[i]
        fl = stage_in_flight(cfg, infl, i, k)      # (unequal chunks: as the stage pricing weighs them)
        key = (fl, sends(i), gs, ga, gt, k)
        r = memo.get(key)
        if r is None:
            room = (cap - k * sb - gs) / fl - ga      # stash bytes per micro-batch the blocks may keep
            e = f(room / k) if room >= 0 else None
            r = memo[key] = (math.inf, False) if e is None else (k * tb + gt + sends(i) * c + k * e, True)
        return r

    if p == 1:
        gs_, ga_, _ = glue[0]
        gt = sum(num.t[j] for j, u in enumerate(units) if u.kind != "block")   # (any glue between blocks too)
        glue[0] = (gs_, ga_, gt)
        return stage(0, ctx.L // step)[0]
    counts, tmax = partition_counts(ctx.L // step, p, stage, rel_tol=REL_TOL, kmin=kmin)
    if counts is None:
        return math.inf
    # (the bisection stops within REL_TOL above the least bottleneck: step back below it)
    return tmax * (1 - 2 * REL_TOL)


# ---- memory alone: least memory to fit, and a floor under any partition --------------------------
def memory_needed(ctx, cfg, prof):
    """Least per-device memory with which this configuration would fit (even split, full
    recomputation where allowed).  Cached per configuration for the search."""
    cache = ctx.__dict__.setdefault("_memory_needed", {})
    key = (cfg, id(prof))
    if key not in cache:
        cache[key] = (_memory_needed(ctx, cfg, prof), prof)     # (prof kept alive: its id stays unique)
    return cache[key][0]


def _memory_needed(ctx, cfg, prof):
    ev = StageEvaluator(ctx, cfg, prof)
    num = ev.num
    p, n = cfg.pp, ev.n
    per = math.ceil(ctx.L / p) if ctx.L else 0
    worst = 0.0
    blocks = [j for j, u in enumerate(ev.units) if u.kind == "block"]
    for i in range(p):
        if p == 1:
            idx = range(n)
        else:
            bl = blocks[i * per:(i + 1) * per]
            if not bl:
                continue
            a = 0 if i == 0 else bl[0]
            b = n if i == p - 1 else bl[-1] + 1
            idx = range(a, b)
        st = sum(num.states[j] for j in idx) - (0.0 if cfg.m > ev.infl[i] else sum(num.gacc[j] for j in idx))
        act = 0.0
        for j in idx:
            al = ev.allowed(ev.units[j])
            act += min(num.act[j][POLICIES.index(x)] for x in al)
        z = gathered_params([ev.units[j] for j in idx], [num.pbytes[j] for j in idx], cfg)
        least = {ev.units[j].name: min(ev.allowed(ev.units[j]), key=lambda x: num.act[j][POLICIES.index(x)])
                 for j in idx}
        worst = max(worst, st + act * ev.infl[i] + ev.transient(idx, least) + z)
    return worst


def memory_floor(ctx, cfg, prof):
    """A lower bound on the device memory of the fullest stage under any partition and recompute
    choice: the stages together hold every unit's states and at least its smallest activations times
    the fewest micro-batches in flight on any stage, so the fullest holds at least 1/pp of that and at
    least its largest unit.  Above the capacity, the exact partition cannot fit (skipped: MoE models
    at scale otherwise spend most of the search proving configurations infeasible)."""
    ev = StageEvaluator(ctx, cfg, prof)
    num, infl = ev.num, min(ev.infl)
    if cfg.schedule == "interleaved" and cfg.v > 1 and interleave_step(ctx, cfg) == 1:
        # chunks of unequal size (stage_in_flight): a device's weighted peak is at least its
        # largest chunk's share of one micro-batch, at least 1/v
        infl = min(infl, 1.0 / cfg.v)
    if cfg.schedule == "dualpipev":     # the head + loss are held stage_peak times, fewer than in flight
        infl = min(infl, stage_peak(cfg.pp, cfg.m, 2 * cfg.pp - 1))
    # (states less the FSDP2 accumulators a stage may not hold at its peak: a bound stays below)
    per = [num.states[j] - num.gacc[j] + infl * min(num.act[j][POLICIES.index(x)] for x in ev.allowed(u))
           for j, u in enumerate(ev.units)]
    return max(sum(per) / cfg.pp, max(per, default=0.0))
