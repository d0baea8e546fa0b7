"""Pipelines over mixed clusters: stages placed on device groups of different kinds, each group
holding a run of consecutive stages, layers per stage in proportion to what its group does.

Layout.  Every stage is `w` devices wide (dp = w, tp = 1: the pipeline's w data-parallel replicas
line up stage to stage), so group g holds devices_g / w stages and the pipeline has P = sum of them.
Each group holds a run of consecutive stages; every order of the groups is tried (up to 3 groups,
else the cluster's order): which group holds the embedding and which the head and loss matters when
they weigh differently.  Ranks are numbered stage by stage, so a group's ranks are consecutive.

Pricing.  One configuration (w, micro-batches m, schedule 1f1b or gpipe, ZeRO stage) is priced as
the homogeneous joint search prices a pipeline (sapp/search/joint/evaluate.py), with each stage's
numbers from its own group: a SearchContext and stage profile per group on a cluster of the group's
kind with the pipeline's P x w devices (its stage mesh, links and memory), and a StageEvaluator of
the configuration on it.  Stage i on group g costs g's evaluator's seg(i, a, b) for units [a, b):
its compute (faster devices, smaller time), its memory against g's devices, its recomputation.  A
send across a group boundary (the last stage of a group forwarding to the next group's first, and
that stage's gradients coming back) goes over the link between groups instead of the group's own:
link_latency + bytes / link_bw per device and send (each of the w replicas sends its own slice).
The partition is the exact min-max one over those per-stage prices (partition_counts for identical
blocks, whose per-stage bisection takes any per-stage speed; partition_dp otherwise), so a slower
group's stages get fewer layers; the step is the schedule's closed form over the per-stage times
and sends (schedule.step_time), plus the slowest stage's gradient sync and optimizer update and the
closing loss all-reduce, as for one kind.  Configurations are priced in order of a provable floor on
their step (step_floor: no partition), skipping those whose floor exceeds the best step found (the
result, ties included, is pricing them all) or reaches the data mode's step (`cutoff`, the auto mode).

Not searched here: tp, sp, cp or ep inside a stage, interleaved schedules, host placement, groups
left idle (the data mode, sapp/search/hetero.py, covers a group alone), pinned stage maps, models
with batch statistics.  The mixed search (sapp/api/mixed.py) prices the data mode and this one and
keeps the faster.
"""
from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import reduce

from ..pipeline.partition import partition_counts, partition_dp
from ..pipeline.profile import cut_at_block_entry
from ..pipeline.schedule import step_time
from .joint.divisors import divisors


MAX_ORDERED = 3          # every order of the groups is tried up to this many groups
PRUNED = "no pipeline beats the data mode's"     # search's reason when `cutoff` pruned every candidate


@dataclass
class PipeResult:
    config: object          # joint.result.Config of the whole pipeline (pp = P, dp = w, tp = 1)
    order: tuple            # group index of every stage
    result: object          # joint.result.JointResult: the stages (each priced on its group) and the step
    link_s: tuple           # per stage: (forward, backward) seconds of one send over the link, 0 inside a group
    evaluations: int = 0


def _virtual(cl, devices):
    """A cluster of `devices` devices of group `cl`'s kind (its node size where it divides)."""
    if devices % cl.gpus_per_node == 0:
        return cl.replace(nodes=devices // cl.gpus_per_node)
    return cl.replace(nodes=1, gpus_per_node=devices)


def refusal(cons, graph_blocks: int) -> str | None:
    """Why pins rule the pipeline mode out, or None."""
    if cons.tp not in (None, 1) or cons.cp not in (None, 1) or cons.ep not in (None, 1) or cons.sp:
        return "tp, cp, ep or sp pinned: the pipeline mode runs dp-only stages"
    if cons.stages:
        return "a pinned stage map names one kind's stages"
    if cons.schedule not in (None, "1f1b", "gpipe") or cons.virtual_chunks not in (None, 1) or cons.placement:
        return "the pipeline mode runs 1f1b or gpipe without host placement"
    if graph_blocks < 2:
        return "the model has fewer than two blocks to cut"
    return None


def widths(mc, cons, blocks):
    """Stage widths w: every group's devices a multiple of w, 2 <= P <= blocks stages."""
    g = reduce(math.gcd, [c.devices for c in mc.groups])
    out = []
    for w in divisors(g):
        P = sum(c.devices // w for c in mc.groups)
        if (2 <= P <= blocks and (cons.dp is None or cons.dp == w) and (cons.pp is None or cons.pp == P)
                and (cons.max_dp is None or w <= cons.max_dp)):
            out.append(w)
    return out


def contexts(graph, mc, B, cons, settings, search_fn) -> dict:
    """Per group: the joint search's context on a cluster of the group's kind with every device of
    the mixed cluster (a pipeline of P stages x w is all of them): its stage mesh, links, memory;
    its stage profiles are built per width on first use (SearchContext.profile)."""
    from .joint.context import SearchContext
    return {g: SearchContext(graph, _virtual(c, mc.devices), B, cons, settings, search_fn)
            for g, c in enumerate(mc.groups)}


def configs(ctx, cons, w, P):
    from .joint.result import Config
    per = ctx.B // w
    out = []
    for m in divisors(per):
        if m < P or (cons.micro_batches is not None and m != cons.micro_batches):
            continue
        for s in ("1f1b", "gpipe"):
            if cons.schedule is not None and s != cons.schedule:
                continue
            for z in ((0, 1, 2, 3) if w > 1 else (0,)):
                if cons.zero is not None and z != cons.zero:
                    continue
                out.append(Config(P, w, 1, m, per // m, s, 1, z))
    return out


def link_send(mc, nbytes) -> float:
    """One device's send of `nbytes` to a stage on another group."""
    return mc.link_latency + nbytes / mc.link_bw if nbytes > 0 else 0.0


def price(mc, evs, order, cfg, ctxs):
    """The configuration with stage i on group order[i] (evs[g]: g's StageEvaluator): PipeResult or None."""
    sends = _Sends(mc, evs, order, cfg.pp)
    starts = _partition(evs, order, cfg.pp, ctxs[order[0]], sends)
    return None if starts is None else _at(mc, evs, order, cfg, ctxs, starts, sends)


def _at(mc, evs, order, cfg, ctxs, starts, sends):
    """The PipeResult of the stages starting at units `starts`, or None where one cannot be priced."""
    priced = _priced_stages(evs, order, cfg, ctxs, starts, sends)
    if priced is None:
        return None
    stages, pairs, link_s = priced
    res = _joint_result(mc, cfg, ctxs, order, stages, pairs)
    res.profile = evs[order[0]].prof
    return PipeResult(cfg, tuple(order), res, tuple(link_s))


class _Sends:
    """Stage i's sends with the stage on group order[i]: over the link where the next (previous)
    stage is on another group, else as its group's StageEvaluator prices them."""

    def __init__(self, mc, evs, order, P):
        self.mc, self.evs, self.order, self.P = mc, evs, order, P

    def pair(self, i, a, b):
        """((seconds, bytes) forward, (seconds, bytes) backward) of one of stage i's sends."""
        order = self.order
        (f, g) = self.evs[order[i]].send_pair(i, a, b)
        if i < self.P - 1 and order[i + 1] != order[i]:
            f = (link_send(self.mc, f[1]), f[1])
        if i > 0 and order[i - 1] != order[i]:
            g = (link_send(self.mc, g[1]), g[1])
        return f, g

    def adj(self, i, a, b):
        """What the link changes in stage i's send seconds over the group's own price."""
        ev = self.evs[self.order[i]]
        (nf, nb), (f, g) = ev.send_counts(i), self.pair(i, a, b)
        return nf * f[0] + nb * g[0] - ev.send_s(i, a, b)

    def seg(self, i, a, b):
        t, fits = self.evs[self.order[i]].seg(i, a, b)
        return (t + self.adj(i, a, b), True) if fits else (math.inf, False)


def _partition(evs, order, P, ctx, sends):
    """Each stage's first unit of the exact min-max partition over the per-stage prices, or None."""
    from .joint.evaluate import _starts_from_counts
    ev0 = evs[order[0]]
    n, units, seg = ev0.n, ev0.units, sends.seg
    if ctx.uniform:
        first = next(i for i, u in enumerate(units) if u.kind == "block")
        pre, post = first, n - first - ctx.L

        def seg_k(i, k):
            if i == 0:
                return seg(0, 0, pre + k)
            if i == P - 1:
                return seg(i, n - post - k, n)
            return seg(i, pre, pre + k)
        counts, _ = partition_counts(ctx.L, P, seg_k)
        return None if counts is None else _starts_from_counts(units, counts)
    cut = [u.cut_before for u in units]
    cut[0] = False
    if cut_at_block_entry(ev0.prof):
        cut[next(i for i, u in enumerate(units) if u.kind == "block")] = False
    return partition_dp(n, P, [True] + cut[1:], seg)[0]


def _priced_stages(evs, order, cfg, ctxs, starts, sends):
    """(stages, (forward, backward) send seconds per stage, link seconds per stage) of the
    partition, or None where a stage cannot be priced."""
    from ..costmodel.gradsync import overlap_rule
    from .joint.evaluate import _exposed_sync, step_copies
    P = cfg.pp
    ends = starts[1:] + [evs[order[0]].n]
    stages, pairs, link_s = [], [], []
    for i, (a, b) in enumerate(zip(starts, ends)):
        st = evs[order[i]].seg(i, a, b, detail=True)
        if st is None:
            return None
        st.send_s += sends.adj(i, a, b)
        f, g = sends.pair(i, a, b)
        pairs.append((f[0], g[0]))
        cross_f = i < P - 1 and order[i + 1] != order[i]
        cross_b = i > 0 and order[i - 1] != order[i]
        link_s.append((f[0] if cross_f else 0.0, g[0] if cross_b else 0.0))
        rule = overlap_rule(ctxs[order[i]].cluster, cfg.zero, P, 1, ctxs[order[i]].settings.runtime)
        if rule != "none":
            st.grad_sync_s = _exposed_sync(evs[order[i]], rule, st, a, b)
        st.grad_sync_s += step_copies(evs[order[i]], a, b)
        stages.append(st)
    return stages, pairs, link_s


def _joint_result(mc, cfg, ctxs, order, stages, pairs):
    """The step of the priced stages (schedule, slowest gradient sync and optimizer update, loss
    sync) and its parts, as a JointResult."""
    from ..costmodel.optimizer import optimizer_step_time
    from .joint.result import JointResult
    ctx = ctxs[order[0]]
    fw, bw = [s.fwd_s for s in stages], [s.bwd_s for s in stages]
    step_pipe = step_time(fw, bw, cfg.m, cfg.schedule, 1, pairs)
    gs = max(s.grad_sync_s for s in stages)
    opt = [optimizer_step_time(s.memory["optimizer"], s.memory["params"], ctxs[order[i]].cluster, ctx.settings,
                               tensors=s.param_tensors / (cfg.dp if cfg.zero == 1 else 1), sharded=cfg.zero >= 2)
           for i, s in enumerate(stages)]
    opt_s = max(opt)
    loss_s = max(c.loss_sync_s for c in ctxs.values())
    step = step_pipe + gs + opt_s + loss_s
    res = JointResult(cfg, step, stages)
    res.overlap = "none"
    res.boundary_bytes = max(s.send_bytes[0] for s in stages)
    res.boundary_grad_bytes = max(s.send_bytes[1] for s in stages)
    busy = cfg.m * max(s.fwd_s + s.bwd_s + s.send_s for s in stages)
    res.bubble_s = max(0.0, step_pipe - busy)
    res.grad_sync_s, res.optimizer_s = gs, opt_s
    res.p2p_s = cfg.m * max(s.send_s for s in stages)
    res.compute_s = cfg.m * max(s.fwd_s + s.bwd_s for s in stages) + opt_s
    res.comm_s = gs + res.p2p_s + loss_s
    res.comm_by_kind = {"reshard": 0.0, "dp_grad_sync": gs, "pp_p2p": res.p2p_s, "loss_sync": loss_s}
    res.peak_memory_bytes = max(s.memory_bytes for s in stages)
    res.capacity_bytes = min(c.cap for c in ctxs.values())
    res.model_flops = ctx.model_flops_per_sample * ctx.B
    peak = sum(c.devices * c.peak_flops for c in mc.groups)
    res.mfu = res.model_flops / (step * peak) if step > 0 else 0.0
    return res


def _least_max(n, fs, L):
    """The least x at which group g's n[g] stages, a stage of k >= 1 blocks on g costing at least
    fs[g][k - 1] (increasing in k), can hold all L blocks: a lower bound on the max over stages."""
    def holds(x):
        x *= 1 + 1e-12
        tot = 0
        for ng, f in zip(n, fs):
            k = bisect_right(f, x)
            if k < 1:
                return False
            tot += ng * k
        return tot >= L
    cand = sorted({v for f in fs for v in f})
    lo, hi = 0, len(cand) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(cand[mid]):
            hi = mid
        else:
            lo = mid + 1
    return cand[lo]


def step_floor(evs, cfg, ctxs, mc, w):
    """A lower bound on price(...)'s step for configuration `cfg` under any order of the groups and any
    partition, every stage holding k >= 1 blocks.  The step is (m - 1) tmax + tsum + the largest stage
    gradient sync + the optimizer step (>= 0) + the loss all-reduce, over stage times T_i >= C_i (the
    compute of its units on its group: sends, recomputation, prefetch edges >= 0) >= k tb_g (g's
    cheapest block time).  tsum >= the glue on its fastest group plus one block per stage on its group
    and the rest on the fastest.  A stage's sync is >= k gb_g (g's cheapest block sync) without
    overlap; under FSDP2's units >= gb_g (its first block is the last bucket) and >= k gb_g - C_i
    (the sync beyond the backward); other rules >= 0.  So for every stage i the step is >= tsum +
    (m - 1) T_i + sync_i >= tsum + f_g(k), and also >= tsum + (m - 1) tmax + max sync with each max
    bounded alone; `_least_max` bounds a max over stages from how many blocks each group's stages
    can hold below it."""
    from ..costmodel.gradsync import overlap_rule
    G, m = len(mc.groups), cfg.m
    units = evs[0].units
    blocks = [j for j, u in enumerate(units) if u.kind == "block"]
    L = len(blocks)
    n = [mc.groups[g].devices // w for g in range(G)]
    tb = [min(evs[g].num.t[j] for j in blocks) for g in range(G)]
    gb = [min(evs[g].num.gs[j] for j in blocks) for g in range(G)]
    glue = sum(min(evs[g].num.t[j] for g in range(G)) for j, u in enumerate(units) if u.kind != "block")
    tsum = glue + sum(ng * t for ng, t in zip(n, tb)) + (L - sum(n)) * min(tb)
    ks = range(1, L + 1)
    ft, fg, fj = [], [], []
    for g in range(G):
        rule = overlap_rule(ctxs[g].cluster, cfg.zero, cfg.pp, 1, ctxs[g].settings.runtime)
        ft.append([k * tb[g] for k in ks])
        if rule == "none":
            fg.append([k * gb[g] for k in ks])
            fj.append([(m - 1) * k * tb[g] + k * gb[g] for k in ks])
        elif rule == "fsdp-units":
            fg.append([gb[g]] * L)
            fj.append([max((m - 1) * k * tb[g] + gb[g], (m - 2) * k * tb[g] + k * gb[g]) for k in ks])
        else:
            fg.append([0.0] * L)
            fj.append([(m - 1) * k * tb[g] for k in ks])
    apart = (m - 1) * max(_least_max(n, ft, L), tsum / cfg.pp) + _least_max(n, fg, L)
    loss_s = max(c.loss_sync_s for c in ctxs.values())
    return (max(apart, _least_max(n, fj, L)) + tsum + loss_s) * (1 - 1e-9)


def search(graph, mc, *, global_batch, constraints, settings, search_fn, cutoff=None):
    """(the fastest PipeResult or None, why none when None, configurations priced).  Branch and bound:
    configurations are priced in order of step_floor and those whose floor exceeds the best step
    found are skipped (the result is the exhaustive search's, ties included).  `cutoff` (the data
    mode's step): configurations whose floor reaches it are skipped too; when none priced beats it,
    (None, "no pipeline beats the data mode's ... s") is returned."""
    from ..errors import SappError
    from .joint.stage import StageEvaluator
    cons = constraints
    best, tried = None, 0
    ctxs = contexts(graph, mc, global_batch, cons, settings, search_fn)
    ctx0 = ctxs[0]
    why = refusal(cons, ctx0.L)
    if why is None and ctx0.batch_stats:
        why = "batch statistics are synced per micro-batch; the pipeline mode is not searched for them"
    if why:
        return None, why, 0
    ws = [w for w in widths(mc, cons, ctx0.L) if global_batch % w == 0]
    if not ws:
        return None, "no stage width divides every group's devices and the batch into 2 or more stages", 0
    G = len(mc.groups)
    perms = list(itertools.permutations(range(G))) if G <= MAX_ORDERED else [tuple(range(G))]
    cands = []              # (floor, sequence in the exhaustive order, w, cfg, evaluators)
    for w in ws:
        try:
            profs = {g: ctxs[g].profile(w, 1) for g in range(G)}
        except SappError:          # no layout of a stage this wide
            continue
        P = sum(c.devices // w for c in mc.groups)
        for cfg in configs(ctxs[0], cons, w, P):
            evs = {g: StageEvaluator(ctxs[g], cfg, profs[g]) for g in range(G)}
            cands.append((step_floor(evs, cfg, ctxs, mc, w), len(cands), w, cfg, evs))
    if not cands:
        return None, ("no stage width leaves at least as many micro-batches as stages (the batch per replica "
                      "is too small)"), 0
    cands.sort(key=lambda c: (c[0], c[1]))
    rank, pruned = None, False
    for floor, seq, w, cfg, evs in cands:
        if best is not None and floor > best.result.step_time_s:
            break                   # every later floor is larger: none can win or tie
        if cutoff is not None and floor >= cutoff:
            pruned = True           # none of these beats the data mode
            break
        for k, perm in enumerate(perms):    # ties: the first order tried (the cluster's), then the first config
            order = tuple(g for g in perm for _ in range(mc.groups[g].devices // w))
            r = price(mc, evs, order, cfg, ctxs)
            tried += 1
            if r is not None and (best is None or (r.result.step_time_s, cfg.key(), seq, k) < rank):
                best, rank = r, (r.result.step_time_s, cfg.key(), seq, k)
    if pruned and (best is None or best.result.step_time_s >= cutoff):
        return None, f"{PRUNED} {cutoff:.4g} s", tried
    if best is None:
        return None, "no pipeline over the groups fits their memory", tried
    best.evaluations = tried
    return best, None, tried


def price_given(graph, mc, *, global_batch, constraints, settings, search_fn, cfg, order, stage_units):
    """The PipeResult of one given pipeline: stage i on group order[i], its units `stage_units[i]`
    (names, as a plan's groups list them), priced as the search prices its candidates (`price`) but on
    these stages instead of the min-max partition.  What `sapp evaluate` of a pipeline-mode mixed plan
    runs.  SappError in one line where the stages are not a partition of the model's units in order, or
    a stage cannot be priced (no layout of its width, past its group's memory)."""
    from ..errors import SappError
    from .joint.stage import StageEvaluator
    ctxs = contexts(graph, mc, global_batch, constraints, settings, search_fn)
    profs = {g: ctxs[g].profile(cfg.dp, 1) for g in range(len(mc.groups))}
    evs = {g: StageEvaluator(ctxs[g], cfg, profs[g]) for g in range(len(mc.groups))}
    names = [u.name for u in evs[order[0]].units]
    flat = [u for units in stage_units for u in units]
    if flat != names or any(not units for units in stage_units):
        raise SappError(f"the plan's stages hold units {flat[:4]}... in an order that is not the model's "
                        f"{len(names)} units ({', '.join(names[:3])}, ...): search the plan again for this model")
    starts, k = [], 0
    for units in stage_units:
        starts.append(k)
        k += len(units)
    r = _at(mc, evs, order, cfg, ctxs, starts, _Sends(mc, evs, order, cfg.pp))
    if r is None:
        raise SappError("a stage of the plan cannot be priced on its group (no layout of its width fits its "
                        "devices); search the plan again for this cluster")
    return r
