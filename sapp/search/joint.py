"""The outer search: pipeline stages x data x tensor parallel degrees x micro-batches x schedule x
recomputation x ZeRO (x placement) on top of the per-stage sharding search.

Structure (branch and bound, deterministic):
  1. enumerate every configuration (pp, dp, tp, m, schedule, v, zero) the cluster, the batch and the
     constraints allow, each with an analytic lower bound on its step time (perfectly split compute
     plus the pipeline bubble) - no sharding search needed for that;
  2. visit them in bound order; the first visit of a (dp, tp) pair builds its per-unit profile (one
     sharding search on the block template, see sapp.pipeline.profile), which gives a tighter bound
     (the profile's real per-micro-batch times, without recomputation);
  3. survivors get the exact evaluation: memory-constrained min-max stage partition with a per-stage
     recomputation choice, closed-form schedule time, exposed gradient sync;
  4. stop when the next bound is no better than the best found.
Ties are broken by (step time, peak memory, pp, tp, micro-batches, schedule, zero).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ..constraints import Constraints
from ..costmodel import CostSettings, collective_time
from ..costmodel.nodes import MATMUL_LIKE
from ..errors import ConstraintError, InfeasibleError, SappError
from ..pipeline.partition import partition_counts, partition_dp
from ..costmodel.optimizer import optimizer_step_time, updated_params
from ..costmodel.primitives import scalar_allreduce_time
from ..pipeline.profile import build_profile, split_units, stage_mesh
from ..pipeline.schedule import in_flight, step_time
from ..recompute.solver import POLICIES, BlockOption, choose_recompute, choose_uniform
from ..units import fmt_bytes, fmt_time

SCHED_ORDER = {"none": 0, "1f1b": 1, "interleaved": 2, "gpipe": 3}


@dataclass(frozen=True)
class Config:
    pp: int
    dp: int
    tp: int
    m: int                  # micro-batches per step
    mbs: int                # micro-batch size per dp replica
    schedule: str           # none | gpipe | 1f1b | interleaved
    v: int                  # virtual chunks (interleaved), else 1
    zero: int

    def key(self):
        return (self.pp, self.tp, self.m, SCHED_ORDER[self.schedule], self.v, self.zero)

    def describe(self):
        s = self.schedule + (f"(v={self.v})" if self.v > 1 else "")
        return f"pp={self.pp} dp={self.dp} tp={self.tp} m={self.m} mbs={self.mbs} {s} zero={self.zero}"


@dataclass
class StageResult:
    index: int
    units: list             # unit names (blocks and glue)
    blocks: list
    fwd_s: float            # per micro-batch
    bwd_s: float            # per micro-batch, recomputation included
    recompute_s: float      # per micro-batch
    send_s: float           # per micro-batch p2p charged to this stage
    grad_sync_s: float      # per step
    in_flight: float
    memory: dict            # params, grads, optimizer, activations, transient
    recompute: dict         # block -> policy
    param_tensors: int = 0  # trainable parameter tensors held (the optimizer dispatches per tensor)

    @property
    def memory_bytes(self):
        return sum(self.memory.values())


@dataclass
class JointResult:
    config: Config
    step_time_s: float
    stages: list
    compute_s: float = 0.0
    comm_s: float = 0.0
    bubble_s: float = 0.0
    grad_sync_s: float = 0.0
    p2p_s: float = 0.0
    host_s: float = 0.0
    optimizer_s: float = 0.0          # device-side optimizer update (part of compute_s)
    comm_by_kind: dict = field(default_factory=dict)   # reshard / dp_grad_sync / pp_p2p / loss_sync seconds
    peak_memory_bytes: float = 0.0
    capacity_bytes: float = 0.0
    model_flops: float = 0.0          # per step (fwd + bwd, no recomputation)
    mfu: float = 0.0
    profile: object = None
    placement: object = None
    feasible: bool = True
    stats: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    alternatives: list = field(default_factory=list)

    @property
    def memory(self):
        worst = max(self.stages, key=lambda s: s.memory_bytes)
        return dict(worst.memory)

    def __repr__(self):
        return (f"JointResult({self.config.describe()}, step_time_s={self.step_time_s:.6g}, "
                f"peak_memory_bytes={self.peak_memory_bytes:.6g}, mfu={self.mfu:.3g})")


# ---- context: everything fixed for one search ----------------------------------------------------
class _Ctx:
    def __init__(self, graph, cluster, global_batch, cons, settings, search_fn):
        self.graph, self.cluster, self.B, self.cons, self.settings = graph, cluster, global_batch, cons, settings
        self.search_fn = search_fn
        self.units = split_units(graph)
        self.block_units = [u for u in self.units if u.kind == "block"]
        self.block_names = [u.name for u in self.block_units]
        self.L = len(self.block_units)
        self.profiles = {}
        self.strategy_cache = {}
        self.numbers = {}
        self.placements = {}
        self.best_by_placement = {}   # option name -> (step, config) of the best feasible config using it
        # host placement is worth pricing for sparse embedding tables or when the user pins it
        self.placement_relevant = bool(cons.placement) or any(
            getattr(p, "sparse_grad", False) for p in graph.params.values())
        self.cap = cluster.usable_memory
        # the step's closing loss all-reduce: the same for every configuration
        self.loss_sync_s = _loss_sync_time(cluster)
        # work per sample in device-seconds at the roofline's compute rate: the analytic bound's
        # numerator (backward = 2x forward FLOPs for GEMM-like ops, 1x otherwise, as the cost model)
        per = sum(n.flops * (3.0 if n.kind in MATMUL_LIKE else 2.0) for n in graph.nodes.values())
        self.work_per_sample = per / graph.batch_size / (cluster.peak_flops * cluster.compute_efficiency)
        self.model_flops_per_sample = 3.0 * graph.total_flops() / graph.batch_size
        self.policy_pins = {b: cons.recompute_policy(b) for b in self.block_names} if cons.recompute is not None else {}
        self.stage_pins = cons.stage_starts(self.block_names) if cons.stages else None
        # structurally identical blocks with no per-block pins: the count fast path applies
        reps = {u.rep for u in self.block_units}
        pins = set(self.policy_pins.values())
        self.uniform = (len(reps) == 1 and len(pins) <= 1 and self.stage_pins is None
                        and self._glue_only_at_ends())

    def _glue_only_at_ends(self):
        kinds = [u.kind for u in self.units]
        if "block" not in kinds:
            return False
        i0 = kinds.index("block")
        i1 = len(kinds) - 1 - kinds[::-1].index("block")
        return all(k == "block" for k in kinds[i0:i1 + 1]) and i0 <= 1 and i1 >= len(kinds) - 2

    def profile(self, dp, tp):
        key = (dp, tp)
        if key not in self.profiles:
            self.profiles[key] = build_profile(self.graph, self.cluster, self.settings, dp, tp,
                                               search_fn=self.search_fn, units=self.units,
                                               strategy_cache=self.strategy_cache,
                                               fixed_strategies=getattr(self, "fixed", None),
                                               max_mbs=max(2, self.B // dp))
        return self.profiles[key]

    def allowed(self, block):
        pin = self.policy_pins.get(block)
        return (pin,) if pin else POLICIES


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_configs(ctx):
    """Every configuration the cluster, batch and constraints allow (no costs yet)."""
    c, cl = ctx.cons, ctx.cluster
    N, gpn = cl.devices, cl.gpus_per_node
    out = []
    tps = [t for t in _divisors(gpn) if (c.tp is None or t == c.tp) and (c.max_tp is None or t <= c.max_tp)]
    for tp in tps:
        if N % tp:
            continue
        for pp in _divisors(N // tp):
            if c.pp is not None and pp != c.pp:
                continue
            if pp > 1 and pp > ctx.L:
                continue
            if pp > 1 and c.placement:
                continue            # placement pins are honoured on single-stage configurations
            if ctx.stage_pins is not None and pp != ctx.stage_pins[-1] + 1:
                continue
            S = N // pp
            if not (gpn % S == 0 or S % gpn == 0):
                continue
            dp = N // (pp * tp)
            if (c.dp is not None and dp != c.dp) or (c.max_dp is not None and dp > c.max_dp):
                continue
            if ctx.B % dp:
                continue
            if stage_mesh(cl, dp, tp)[0] is None:  # noqa: E501 (tp must fit a node)
                continue
            per_rep = ctx.B // dp
            for m in _divisors(per_rep):
                if c.micro_batches is not None and m != c.micro_batches:
                    continue
                if pp > 1 and m < pp and c.micro_batches is None:
                    continue            # fewer micro-batches than stages: idle stages, never better
                scheds = []
                if pp == 1:
                    scheds = [("none", 1)]
                else:
                    scheds = [("1f1b", 1), ("gpipe", 1)]
                    for v in (2, 4):
                        if m % pp == 0 and ctx.uniform and ctx.L % (pp * v) == 0:
                            scheds.append(("interleaved", v))
                for s, v in scheds:
                    if c.schedule is not None and s != c.schedule:
                        continue
                    if s != "gpipe" and m < pp:
                        continue        # torch's 1F1B schedules need micro-batches >= stages
                    if c.virtual_chunks is not None and s == "interleaved" and v != c.virtual_chunks:
                        continue
                    for z in ((0, 1, 2, 3) if dp > 1 else (0,)):
                        if c.zero is not None and z != c.zero and dp > 1:
                            continue
                        out.append(Config(pp, dp, tp, m, per_rep // m, s, v, z))
    return out


def analytic_bound(ctx, cfg):
    """Perfectly split compute plus the bubble: no configuration can be faster."""
    w = ctx.work_per_sample * ctx.B / ctx.cluster.devices
    p, m = cfg.pp, cfg.m
    if p == 1:
        return w
    if cfg.schedule == "interleaved":
        return w * (1 + (p - 1) / (cfg.v * m))
    return w * (1 + (p - 1) / m)


# ---- evaluation of one configuration -------------------------------------------------------------
class _Numbers:
    """Unit numbers at one (profile, micro-batch size, zero); identical units computed once."""

    def __init__(self, prof, cfg, ctx):
        per_rep = {}
        self.t, self.act, self.extra, self.out, self.states, self.gs, self.pbytes, self.fwd, self.lat = (
            [] for _ in range(9))
        for u in prof.units:
            key = u.rep if u.kind == "block" else u.name
            r = per_rep.get(key)
            if r is None:
                f, b, act, extra, out = u.at(cfg.mbs, cfg.zero)
                st = u.states[cfg.zero]
                r = (f + b, act, extra, out, st["params"] + st["grads"] + st["optimizer"],
                     u.grad_sync[cfg.zero], u.states[0]["params"], f, u.sync_lat.get(cfg.zero, 0.0))
                per_rep[key] = r
            for lst, val in zip((self.t, self.act, self.extra, self.out, self.states, self.gs, self.pbytes,
                                 self.fwd, self.lat), r):
                lst.append(val)
        self.boundary = max((o for u, o in zip(prof.units, self.out) if u.kind == "block"), default=0.0)


def _numbers(ctx, prof, cfg):
    key = (prof.dp, prof.tp, cfg.mbs, cfg.zero)
    n = ctx.numbers.get(key)
    if n is None:
        n = ctx.numbers[key] = _Numbers(prof, cfg, ctx)
    return n


def _p2p_time(ctx, cfg, nbytes):
    if cfg.pp == 1 or nbytes <= 0:
        return 0.0
    gpn = ctx.cluster.gpus_per_node
    S = ctx.cluster.devices // cfg.pp
    link = "inter" if (S >= gpn or S * cfg.pp > gpn) else "intra"
    return collective_time("p2p", nbytes, 2, link, ctx.cluster)


class _Evaluator:
    """Prices stages of one configuration; `seg(i, a, b)` for units [a, b) as stage i."""

    def __init__(self, ctx, cfg, prof, policy=None, cap_extra=0.0):
        self.ctx, self.cfg, self.prof = ctx, cfg, prof
        self.cap = ctx.cap + cap_extra
        self.num = _numbers(ctx, prof, cfg)
        self.n = len(prof.units)
        self.units = prof.units
        self.c = _p2p_time(ctx, cfg, self.num.boundary)
        self.infl = in_flight(cfg.schedule, cfg.pp, cfg.m, cfg.v)
        self.policy = policy       # force one policy for every block (exhaustive benchmark)
        self.cache = {}

    def allowed(self, u):
        if u.kind != "block":
            return ("none",)
        if self.policy is not None:
            return (self.policy,)
        return self.ctx.allowed(u.name)

    def sends(self, i):
        p = self.cfg.pp
        s = (1 if i < p - 1 else 0) + (1 if i > 0 else 0)
        if self.cfg.schedule == "interleaved":
            s = 2 * self.cfg.v - (1 if i == p - 1 else 0) - (1 if i == 0 else 0)
        return s

    def seg(self, i, a, b, detail=False):
        key = (i, a, b)
        if not detail and key in self.cache:
            return self.cache[key]
        num, cap = self.num, self.cap
        idx = range(a, b)
        if not any(self.units[j].kind == "block" for j in idx) and self.cfg.pp > 1:
            r = (math.inf, False) if not detail else None
            self.cache[key] = r
            return r
        t = sum(num.t[j] for j in idx) + self.sends(i) * self.c
        states = sum(num.states[j] for j in idx)
        z3 = max((num.pbytes[j] for j in idx), default=0.0) if self.cfg.zero == 3 else 0.0
        infl = self.infl[i]
        types, fixed_act, fixed_extra = {}, 0.0, 0.0
        for j in idx:
            u = self.units[j]
            al = self.allowed(u)
            if len(al) == 1:
                k = POLICIES.index(al[0])
                fixed_act += num.act[j][k]
                fixed_extra += num.extra[j][k]
                continue
            tk = (u.rep, al)
            if tk not in types:
                types[tk] = [0, BlockOption(num.act[j], num.extra[j]), al, []]
            types[tk][0] += 1
            types[tk][3].append(u.name)
        free_act0 = sum(tv[0] * tv[1].act[0] for tv in types.values())
        base = cap - states - z3
        choice, transient = None, 0.0
        # blocks pinned to selective/full recompute need the rematerialisation headroom regardless
        pinned = any(len(al) == 1 and al[0] != "none" for al in (self.allowed(self.units[j]) for j in idx))
        if not pinned and fixed_act + free_act0 <= base / infl + 1e-9 * cap:
            extra = fixed_extra
            acts = fixed_act + free_act0
            counts = [(tv[0], 0, 0) for tv in types.values()]
            choice = (acts, extra, counts)
        else:
            transient = max((num.act[j][0] for j in idx if self.units[j].kind == "block"), default=0.0)
            budget = (base - transient) / infl - fixed_act
            if budget >= 0:
                tl = list(types.values())
                if len(tl) == 1 and tl[0][2] == POLICIES:
                    rc = choose_uniform(tl[0][0], tl[0][1], budget)
                elif not tl:
                    rc = None
                    choice = (fixed_act, fixed_extra, [])
                else:
                    rc = choose_recompute([(tv[0], tv[1]) for tv in tl], budget) if all(
                        tv[2] == POLICIES for tv in tl) else _choose_restricted(tl, budget)
                if rc is not None:
                    choice = (fixed_act + rc.act_bytes, fixed_extra + rc.extra_s, list(rc.counts))
        if choice is None:
            r = (math.inf, False) if not detail else None
            self.cache[key] = r
            return r
        acts, extra, counts = choice
        T = t + extra
        if not detail:
            self.cache[key] = (T, True)
            return (T, True)
        # detailed: per-block policies (recompute the last blocks of each type first: deterministic)
        policies = {}
        for (tv, cnt) in zip(types.values(), counts):
            names = tv[3]
            nn, ns, nf = cnt
            for q, name in enumerate(names):
                policies[name] = "none" if q < nn else ("selective" if q < nn + ns else "full")
        for j in idx:
            u = self.units[j]
            al = self.allowed(u)
            if u.kind == "block" and len(al) == 1:
                policies[u.name] = al[0]
        st = {"params": 0.0, "grads": 0.0, "optimizer": 0.0}
        for j in idx:
            for k2, v2 in self.units[j].states[self.cfg.zero].items():
                st[k2] += v2
        fwd = sum(num.fwd[j] for j in idx)
        return StageResult(
            index=i, units=[self.units[j].name for j in idx],
            blocks=[self.units[j].name for j in idx if self.units[j].kind == "block"],
            fwd_s=fwd, bwd_s=t - self.sends(i) * self.c - fwd + extra, recompute_s=extra,
            send_s=self.sends(i) * self.c,
            grad_sync_s=sum(num.gs[j] for j in idx) + max((num.lat[j] for j in idx), default=0.0), in_flight=infl,
            memory={"params": st["params"], "grads": st["grads"], "optimizer": st["optimizer"],
                    "activations": acts * infl, "transient": transient + z3},
            recompute=policies, param_tensors=sum(self.units[j].tensors for j in idx))


def _choose_restricted(types, budget):
    """Recompute choice when some block types may only use a subset of the policies."""
    from ..recompute.solver import RecomputeChoice, _pareto, _type_frontier
    cur = [(0.0, 0.0, ())]
    for n, opt, al, _ in types:
        f = _type_frontier(n, opt, al)
        cur = _pareto([(a1 + a2, e1 + e2, c1 + (c2,)) for a1, e1, c1 in cur for a2, e2, c2 in f])
    best = None
    for act, ext, counts in cur:
        if act <= budget * (1 + 1e-12) and (best is None or ext < best.extra_s):
            best = RecomputeChoice(act, ext, counts)
    return best


def evaluate_config(ctx, cfg, prof=None, *, exact=False, policy=None, placement=True):
    """Exact evaluation of one configuration: JointResult, or None if nothing fits.  With
    `placement`, host placements (sapp.placement) are tried where they matter (see _placed)."""
    prof = prof or ctx.profile(cfg.dp, cfg.tp)
    res = _evaluate(ctx, cfg, prof, exact=exact, policy=policy)
    if res is not None:
        _remember_placement(ctx, "device", res)
    if placement and cfg.pp == 1 and (ctx.placement_relevant or res is None):
        if res is None and not ctx.placement_relevant:
            # host placement saves at most the model states: skip when even that cannot fit
            num = _numbers(ctx, prof, cfg)
            if _memory_needed(ctx, cfg, prof) - sum(num.states) > ctx.cap:
                return None
        res = _placed(ctx, cfg, prof, res, exact, policy)
    return res


def _placed(ctx, cfg, prof, res_dev, exact, policy):
    """Host placement for a single-stage configuration: every option placement_options offers for
    the whole model (device first), each scored by re-running the stage with the device bytes it
    saves and adding its exposed host time; the fastest feasible one wins (device on ties)."""
    from ..placement import placement_options
    num = _numbers(ctx, prof, cfg)
    compute = cfg.m * sum(num.t)
    key = (cfg.dp, cfg.tp, cfg.zero, cfg.m, cfg.mbs)
    opts = ctx.placements.get(key)
    if opts is None:
        opts = ctx.placements[key] = placement_options(
            ctx.graph, list(ctx.graph.nodes), ctx.cluster, ctx.settings, dp=cfg.dp, tp=cfg.tp, zero=cfg.zero,
            micro_batches=cfg.m, compute_s=compute, pins=ctx.cons.placement, micro_batch_size=cfg.mbs)
    best = res_dev if any(o.name == "device" for o in opts) else None
    if best is not None:
        _remember_placement(ctx, "device", best)
    for o in opts:
        if o.name == "device":
            continue
        r = _evaluate(ctx, cfg, prof, exact=exact, policy=policy, cap_extra=o.device_bytes_saved)
        if r is None:
            continue
        # the host now updates what it holds: drop that share of the device update time
        moved = _offloaded_update_share(o, r, ctx)
        r.step_time_s += o.extra_time_s - moved
        r.compute_s -= moved
        r.optimizer_s -= moved
        r.host_s = o.extra_time_s
        r.placement = o
        for st in r.stages:
            st.memory["host_offload"] = -o.device_bytes_saved
        r.peak_memory_bytes = max(st.memory_bytes for st in r.stages)
        r.mfu = r.model_flops / (r.step_time_s * ctx.cluster.devices * ctx.cluster.peak_flops)
        _remember_placement(ctx, o.name, r)
        if best is None or _rank(r) < _rank(best):
            best = r
    return best


def _remember_placement(ctx, name, res):
    """Best feasible configuration per placement option, for the note that says which won."""
    cur = ctx.best_by_placement.get(name)
    if cur is None or (res.step_time_s, res.config.key()) < (cur[0], cur[1].key()):
        ctx.best_by_placement[name] = (res.step_time_s, res.config)


def _offloaded_update_share(option, res, ctx):
    """Device optimizer time no longer spent once `option` updates some parameters on the host: the
    offloaded dense parameters and the host tables, as a share of what the device updated."""
    comp = option.section.get("predicted", {}).get("components", {})
    n_host = comp.get("optimizer", {}).get("params_on_host", 0.0)
    for t in comp.get("embedding", {}).get("tables", {}).values():
        n_host += t["rows"] * t["dim"] / res.config.tp
    st = max(res.stages, key=lambda s: s.memory["optimizer"])
    n_dev = updated_params(st.memory["optimizer"], st.memory["params"], ctx.settings)
    if n_dev <= 0:
        return 0.0
    return res.optimizer_s * min(1.0, n_host / n_dev)


def _evaluate(ctx, cfg, prof, *, exact=False, policy=None, cap_extra=0.0):
    ev = _Evaluator(ctx, cfg, prof, policy, cap_extra)
    n, p = ev.n, cfg.pp
    starts = _partition(ctx, ev, cfg, exact)
    if starts is None:
        return None
    ends = starts[1:] + [n]
    stages = [ev.seg(i, a, b, detail=True) for i, (a, b) in enumerate(zip(starts, ends))]
    if any(s is None for s in stages):
        return None
    if cfg.schedule == "interleaved" and cfg.v > 1:
        _interleave_blocks(ctx, cfg, stages)
    fw = [s.fwd_s for s in stages]
    bw = [s.bwd_s for s in stages]
    step_pipe = step_time(fw, bw, cfg.m, cfg.schedule if p > 1 else "1f1b", cfg.v, ev.c)
    gs = max(s.grad_sync_s for s in stages)
    # the optimizer update runs after the last backward on every stage; the slowest one counts.
    # Its dispatch is per parameter tensor: ZeRO-1 partitions whole tensors over dp; ZeRO-2/3
    # (FSDP2) and tensor parallelism hold every tensor as a sharded DTensor.
    sharded = cfg.zero >= 2 or cfg.tp > 1
    opt_s = max(optimizer_step_time(s.memory["optimizer"], s.memory["params"], ctx.cluster, ctx.settings,
                                    tensors=s.param_tensors / (cfg.dp if cfg.zero == 1 else 1), sharded=sharded)
                for s in stages)
    loss_s = ctx.loss_sync_s
    step = step_pipe + gs + opt_s + loss_s
    T = [s.fwd_s + s.bwd_s + s.send_s for s in stages]
    busy = cfg.m * max(T)
    compute_like = cfg.m * max(s.fwd_s + s.bwd_s for s in stages)
    res = JointResult(cfg, step, stages)
    res.bubble_s = max(0.0, step_pipe - busy)
    res.grad_sync_s = gs
    res.p2p_s = cfg.m * max(s.send_s for s in stages)
    # tensor-parallel resharding is priced inside the units' fwd/bwd; report it as communication
    by_name = {u.name: u for u in prof.units}
    tp_comm = cfg.m * max(sum(by_name[n].reshard_at(cfg.mbs) for n in s.units if n in by_name) for s in stages)
    res.optimizer_s = opt_s
    res.compute_s = compute_like + opt_s - tp_comm
    res.comm_s = gs + res.p2p_s + tp_comm + loss_s
    res.comm_by_kind = {"reshard": tp_comm, "dp_grad_sync": gs, "pp_p2p": res.p2p_s, "loss_sync": loss_s}
    res.peak_memory_bytes = max(s.memory_bytes for s in stages)
    res.capacity_bytes = ctx.cap
    res.model_flops = ctx.model_flops_per_sample * ctx.B
    res.mfu = res.model_flops / (step * ctx.cluster.devices * ctx.cluster.peak_flops) if step > 0 else 0.0
    res.profile = prof
    return res


def _loss_sync_time(cluster) -> float:
    """The emitted step's closing all-reduce of one fp32 loss over every rank (the global-batch loss
    it reports): latency only, ~0.8 ms on gloo, microseconds on NCCL."""
    n = cluster.devices
    if n <= 1:
        return 0.0
    return scalar_allreduce_time(n, "inter" if cluster.nodes > 1 else "intra", cluster)


def _interleave_blocks(ctx, cfg, stages):
    """Priced as contiguous equal shares; the real interleaved layout gives device i the chunks
    c * pp + i (identical blocks, so the numbers are the same).  Rename blocks to the real ones."""
    flat = ctx.block_names
    k = len(flat) // (cfg.pp * cfg.v)
    for st in stages:
        real = [b for c in range(cfg.v) for b in flat[(c * cfg.pp + st.index) * k:(c * cfg.pp + st.index + 1) * k]]
        pols = [st.recompute.get(b, "none") for b in st.blocks]
        st.recompute = dict(zip(real, pols))
        st.blocks = real


def _partition(ctx, ev, cfg, exact):
    n, p = ev.n, cfg.pp
    if ctx.stage_pins is not None:
        return _pinned_starts(ctx, ev, p)
    if p == 1:
        return [0] if ev.seg(0, 0, n)[1] else None
    units = ev.units
    if cfg.schedule == "interleaved":
        # v chunks per device, equal blocks per device (L divisible by p*v, checked when enumerating)
        k = ctx.L // p
        starts = _starts_from_counts(units, [k] * p)
        ends = starts[1:] + [n]
        if all(ev.seg(i, a, b)[1] for i, (a, b) in enumerate(zip(starts, ends))):
            return starts
        return None
    if ctx.uniform and not exact:
        first = next(i for i, u in enumerate(units) if u.kind == "block")
        pre, post = first, n - first - ctx.L

        def seg_k(i, k):
            # identical blocks: only the count matters, plus the glue on the first / last stage
            if i == 0:
                return ev.seg(0, 0, pre + k)
            if i == p - 1:
                return ev.seg(i, n - post - k, n)
            return ev.seg(i, pre, pre + k)
        counts, _ = partition_counts(ctx.L, p, seg_k)
        if counts is None:
            return None
        return _starts_from_counts(units, counts)
    cut = [u.cut_before for u in units]
    cut[0] = False
    starts, _ = partition_dp(n, p, [True] + cut[1:], ev.seg)
    return starts


def _starts_from_counts(units, counts):
    blocks = [i for i, u in enumerate(units) if u.kind == "block"]
    starts, acc = [0], 0
    for k in counts[:-1]:
        acc += k
        starts.append(blocks[acc])
    return starts


def _pinned_starts(ctx, ev, p):
    per = ctx.stage_pins
    blocks = [i for i, u in enumerate(ev.units) if u.kind == "block"]
    starts = [0]
    for bi in range(1, len(per)):
        if per[bi] != per[bi - 1]:
            starts.append(blocks[bi])
    ends = starts[1:] + [ev.n]
    if not all(ev.seg(i, a, b)[1] for i, (a, b) in enumerate(zip(starts, ends))):
        return None
    return starts


def profile_bound(ctx, cfg, prof):
    """Tighter bound from the profile: real per-micro-batch unit times (no recomputation), the
    stage-boundary sends every pipeline pays, the cheapest possible gradient sync (bandwidth spread
    evenly, latency once) and the bubble."""
    num = _numbers(ctx, prof, cfg)
    p, m = cfg.pp, cfg.m
    c = _p2p_time(ctx, cfg, num.boundary)
    sends = (2 * cfg.v * p - 2) if cfg.schedule == "interleaved" else 2 * (p - 1)
    tot = sum(num.t) + sends * c
    tmax = max(tot / p, max(num.t))
    gs = sum(num.gs) / p + max(num.lat, default=0.0)
    if p == 1:
        return m * tot + gs
    if cfg.schedule == "interleaved":
        return m * tmax + (tot - tmax) / cfg.v + gs
    return (m - 1) * tmax + tot + gs


# ---- the search -----------------------------------------------------------------------------------
def _rank(res):
    return (res.step_time_s, res.peak_memory_bytes) + res.config.key()


def joint_search(graph, cluster, *, global_batch, constraints=None, settings=None, search_fn=None,
                 progress=None, exhaustive=False, ignore_capacity=False, fixed_strategies=None) -> JointResult:
    """Best feasible configuration.  Raises InfeasibleError (one line: the smallest per-device memory
    that would fit and the best configuration tried) when nothing fits."""
    t0 = time.perf_counter()
    cons = Constraints.from_dict(constraints)
    settings = settings or CostSettings()
    if global_batch is None or global_batch < 1:
        raise SappError(f"global batch must be a positive integer, got {global_batch!r}")
    ctx = _Ctx(graph, cluster, int(global_batch), cons, settings, search_fn)
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
        prof = ctx.profile(cfg.dp, cfg.tp)
        if best is not None and not exhaustive and profile_bound(ctx, cfg, prof) > best.step_time_s:
            pruned += 1
            continue
        evaluated += 1
        res = evaluate_config(ctx, cfg, prof)
        if progress is not None:
            progress(evaluated, len(ranked))
        if res is None:
            need = _memory_needed(ctx, cfg, prof)
            if closest is None or need < closest[0]:
                closest = (need, cfg)
            continue
        feasible_seen.append(res)
        if best is None or _rank(res) < _rank(best):
            best = res
    if best is None:
        need, cfg = closest
        raise InfeasibleError(
            f"no configuration fits {fmt_bytes(ctx.cap)} per device even with full recomputation and ZeRO-3; "
            f"the closest ({cfg.describe()}) needs {fmt_bytes(need)} per device: use devices with more "
            f"memory, more devices, or a smaller batch", needed_bytes=need, capacity_bytes=ctx.cap, best=cfg)
    best.stats = {"configs": len(configs), "evaluated": evaluated, "pruned": pruned,
                  "profiles": len(ctx.profiles), "searches": len(ctx.strategy_cache),
                  "search_s": time.perf_counter() - t0}
    best.capacity_bytes = cluster.usable_memory
    best.notes = _notes(ctx, best)
    best.alternatives = _alternatives(best, feasible_seen)
    return best


def _alternatives(best, seen, k=5):
    """The next-best evaluated configurations (one per pp/dp/tp/schedule), for `sapp explain`."""
    out, keys = [], {(best.config.pp, best.config.dp, best.config.tp, best.config.schedule)}
    for r in sorted(seen, key=_rank):
        c = r.config
        key = (c.pp, c.dp, c.tp, c.schedule)
        if key in keys:
            continue
        keys.add(key)
        pol = {}
        for s in r.stages:
            for v in s.recompute.values():
                pol[v] = pol.get(v, 0) + 1
        out.append({"parallel": {"dp": c.dp, "tp": c.tp, "pp": c.pp}, "schedule": c.schedule,
                    "micro_batches": c.m, "virtual_chunks": c.v, "zero": c.zero,
                    "recompute": max(sorted(pol), key=lambda x: pol[x]) if pol else "none",
                    "predicted": {"step_time_s": r.step_time_s, "peak_memory_bytes": r.peak_memory_bytes},
                    "feasible": True})
        if len(out) >= k:
            break
    return out


def _memory_needed(ctx, cfg, prof):
    """Least per-device memory with which this configuration would fit (even split, full
    recomputation where allowed)."""
    ev = _Evaluator(ctx, cfg, prof)
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
        st = sum(num.states[j] for j in idx)
        act = 0.0
        for j in idx:
            al = ev.allowed(ev.units[j])
            act += min(num.act[j][POLICIES.index(x)] for x in al)
        tr = max((num.act[j][0] for j in idx if ev.units[j].kind == "block"), default=0.0)
        worst = max(worst, st + act * ev.infl[i] + tr)
    return worst


def _notes(ctx, res):
    cfg = res.config
    out = [f"searched {res.stats['configs']} configurations: {res.stats['evaluated']} evaluated, "
           f"{res.stats['pruned']} pruned by lower bounds, {res.stats['profiles']} stage profiles from "
           f"{res.stats['searches']} sharding searches"]
    if cfg.pp > 1:
        out.append(f"{cfg.pp} pipeline stages with {cfg.m} micro-batches ({cfg.schedule}"
                   f"{', v=' + str(cfg.v) if cfg.v > 1 else ''}): bubble {res.bubble_s / res.step_time_s:.1%} of the step")
    else:
        out.append("no pipeline: the model's states and activations fit one stage"
                   + (f" with {cfg.m} accumulation steps" if cfg.m > 1 else ""))
    pol = {}
    for s in res.stages:
        for b, v in s.recompute.items():
            pol[v] = pol.get(v, 0) + 1
    if pol.get("selective") or pol.get("full"):
        out.append("recomputation: " + ", ".join(f"{k} x{v}" for k, v in sorted(pol.items())))
    if cfg.zero:
        out.append(f"ZeRO-{cfg.zero} over dp={cfg.dp}: model states per device "
                   f"{fmt_bytes(sum(res.memory[k] for k in ('params', 'grads', 'optimizer')))}")
    pl = res.placement
    if pl is not None and pl.name != "device":
        pr = pl.section.get("predicted", {})
        out.append(f"placement {pl.name}: saves {fmt_bytes(pl.device_bytes_saved)} per device, host work "
                   f"{fmt_time(pr.get('host_s', 0.0))} of which {fmt_time(pl.extra_time_s)} is exposed")
    if len(ctx.best_by_placement) > 1:
        ranked = sorted(ctx.best_by_placement.items(), key=lambda kv: (kv[1][0], kv[0]))
        out.append("placement weighed: " + "; ".join(
            f"{name} best {fmt_time(t)} ({c.describe()})" for name, (t, c) in ranked)
            + f" -> {ranked[0][0]} wins")
    out.append(f"peak memory {fmt_bytes(res.peak_memory_bytes)} of {fmt_bytes(res.capacity_bytes)} per device")
    return out


def exhaustive_search(graph, cluster, *, global_batch, constraints=None, settings=None, search_fn=None,
                      policies=POLICIES, exact_partition=True):
    """Reference for the quality benchmark: every configuration x every uniform recompute policy,
    no pruning, same cost model and stage profiles, exact partition (the O(p n^2) DP, or with
    exact_partition=False the count bisection, which tests/test_pipeline_partition.py checks equal
    to the DP for identical blocks).  Returns the best JointResult (or None) and the number of
    (configuration, policy) pairs scored."""
    cons = Constraints.from_dict(constraints)
    ctx = _Ctx(graph, cluster, int(global_batch), cons, settings or CostSettings(), search_fn)
    best, scored = None, 0
    for cfg in enumerate_configs(ctx):
        prof = ctx.profile(cfg.dp, cfg.tp)
        for pol in policies:
            scored += 1
            res = evaluate_config(ctx, cfg, prof, exact=exact_partition, policy=pol)
            if res is not None and (best is None or _rank(res) < _rank(best)):
                best = res
    return best, scored
