"""Enumeration of the (pp, dp, tp, micro-batches, schedule, virtual chunks, ZeRO, cp) configurations
the cluster, the batch and the constraints allow."""
from __future__ import annotations

from ...pipeline.profile import stage_mesh
from ...pipeline.dualpipe import dualpipev_problem
from ...pipeline.schedule import interleave_rounds, too_long
from .divisors import divisors
from .ep import ep_configs
from .result import Config


def _sp_options(cons, tp, moe=False):
    """Sequence parallelism is a choice per tp degree > 1 (off first: ties keep the plain layout);
    a target engine may fix it (constraints.TARGETS), for MoE models apart ("moe_sp": Megatron-Core's
    MoE layer raises in training at tp > 1 without it)."""
    pin = getattr(cons, "sp", None)
    lim = getattr(cons, "limits", None) or {}
    rule = lim.get("moe_sp", lim.get("sp", "any")) if moe else lim.get("sp", "any")
    if rule == "off" or (rule == "with-tp" and tp == 1):
        return (False,) if not pin else ()
    if rule == "with-tp":
        return (True,) if pin is not False else ()
    if tp == 1:
        return (False,) if not pin else ()
    return (pin,) if pin is not None else (False, True)


def enumerate_configs(ctx):
    """Every configuration the cluster, batch and constraints allow (no costs yet)."""
    c, cl = ctx.cons, ctx.cluster
    N, gpn = cl.devices, cl.gpus_per_node
    out = []
    cp_ok = _cp_filter(ctx)
    lim = c.limits or {}
    single = lim.get("model_parallel") is False      # a data-parallel-only engine (DeepSpeed's JSON)
    tps = [t for t in divisors(gpn) if (c.tp is None or t == c.tp) and (c.max_tp is None or t <= c.max_tp)
           and not (single and t > 1)]
    for tp in tps:
        if N % tp:
            continue
        for pp in divisors(N // tp):
            if c.pp is not None and pp != c.pp:
                continue
            if pp > 1 and (pp > ctx.L or single):
                continue
            if ctx.stage_pins is not None and pp != ctx.stage_pins[-1] + 1:
                continue
            S = N // pp
            if not (gpn % S == 0 or S % gpn == 0):
                continue
            for cp in (cp_ok(N // (pp * tp)) if not single else [1]):
                dp = N // (pp * tp * cp)
                if ctx.batch_stats and (cp > 1 or (dp > 1 and (pp > 1 or ctx.batch_stats_unsynced))):
                    continue        # batch statistics are synced over dp in whole modules only (batch_stats_problem)
                if (c.dp is not None and dp != c.dp) or (c.max_dp is not None and dp > c.max_dp):
                    continue
                if ctx.B % dp:
                    continue
                if stage_mesh(cl, dp * cp, tp)[0] is None:  # noqa: E501 (tp must fit a node)
                    continue
                _configs_at(ctx, c, out, pp, dp, tp, cp)
    return out


def _has_experts(ctx) -> bool:
    """Whether the model holds expert GEMMs (a zoo MoE's or an HF MoE's), read once per search."""
    got = ctx.__dict__.get("_has_experts")
    if got is None:
        got = ctx.__dict__["_has_experts"] = any(n.extra.get("experts") for n in ctx.graph.nodes.values())
    return got


def _cp_filter(ctx):
    """n -> the cp degrees to try on n devices (1 only for models CP cannot split, or when pinned)."""
    from .cp import cp_degrees
    pin = getattr(ctx.cons, "cp", None)
    if host_pinned(ctx.cons):
        pin = 1         # host placement is not emitted beside context parallelism: honour the pins
    cache = {}

    def degrees(n):
        if n not in cache:
            cache[n] = [x for x in cp_degrees(ctx.graph, n) if pin is None or x == pin] if pin != 1 else [1]
        return cache[n]
    return degrees


def host_pinned(cons) -> bool:
    """Whether placement pins ask for something on the host (what a cp > 1 plan cannot run)."""
    return any(v == "host" for v in (getattr(cons, "placement", None) or {}).values())


def _configs_at(ctx, c, out, pp, dp, tp, cp):
    per_rep = ctx.B // dp
    for m in divisors(per_rep):
        if c.micro_batches is not None and m != c.micro_batches:
            continue
        if ctx.batch_stats and m > 1:
            continue            # a micro-batch's statistics are not the batch's (batch_stats_problem)
        if pp > 1 and m < pp and c.micro_batches is None and not ctx.batch_stats:
            continue            # fewer micro-batches than stages: idle stages, never better
        scheds = []
        if pp == 1:
            scheds = [("none", 1)]
        else:
            scheds = [("1f1b", 1), ("gpipe", 1)] + [("interleaved", v) for v in interleave_values(ctx, pp, m)]
            scheds += [("dualpipev", 2)] if dualpipev_fits(ctx, pp, m) else []
        lim = c.limits or {}
        for s, v in scheds:
            if (c.schedule is not None and s != c.schedule) or (lim and s not in lim["schedules"]):
                continue
            if s != "gpipe" and m < pp and not (s == "1f1b" and ctx.batch_stats):
                # torch's 1F1B schedules need micro-batches >= stages (with fewer, 1F1B's order is
                # GPipe's, which the emitter then runs: a batch-statistics model's one micro-batch)
                continue
            if c.virtual_chunks is not None and s == "interleaved" and v != c.virtual_chunks:
                continue
            if cp > 1 and _plain_dp_equivalent(c, dp, cp, per_rep // m):
                continue
            if cp > 1 and not _cp_searched(ctx, c, pp, tp):
                continue
            for z in ((0, 1, 2, 3) if dp * cp > 1 else (0,)):  # ZeRO shards over dp x cp
                # a pinned ZeRO stage is what the plan must say: a dp = 1 configuration
                # (nothing to shard over) would be written as zero 0 beside the pin
                if (c.zero is not None and z != c.zero) or (lim and z not in lim["zero"]):
                    continue
                if z == 0 and lim.get("ddp_alone") and dp * cp > 1 and (tp, pp, cp) != (1, 1, 1):
                    continue
                if z == 3 and s == "dualpipev" and not lim:
                    # sapp's emitter: FSDP2 resharding after forward beside torch's weight-gradient pass
                    # run later (stage_backward_weight) trained wrong (7.9e-3 off at dp 2 x pp 2, gloo)
                    continue
                for sp in _sp_options(c, tp, _has_experts(ctx)):
                    cfg = Config(pp, dp, tp, m, per_rep // m, s, v, z, cp=cp, sp=sp)
                    # (moe_a2a_overlap: only where Megatron-Core runs it, ep > 1: ep.ep_configs)
                    if (c.ep is None or c.ep == 1) and c.dp_replicate in (None, 1) and not ctx.settings.moe_a2a_overlap:
                        out.append(cfg)
                    if cp == 1 and lim.get("model_parallel", True) and c.dp_replicate in (None, 1):
                        out += ep_configs(ctx, cfg)     # expert parallelism: without cp (nor HSDP)
                    out += hsdp_configs(c, cfg)


def hsdp_configs(c, cfg) -> list:
    """cfg as HSDP with each replica count it may take (torchtitan's data_parallel_replicate_degree beside
    its shard degree): FSDP2 (ZeRO-2/3) over shard groups of at least 2 data-parallel ranks (replicas of a
    context-parallel group alone are torchtitan's DDP rule, refused beside cp), where the target runs it
    (TARGETS "hsdp") or a pin asks for it; none beside expert parallelism (not priced)."""
    lim, pin = c.limits or {}, c.dp_replicate
    if cfg.zero < 2 or pin == 1 or not (lim.get("hsdp") or pin) or (c.ep or 1) > 1:
        return []
    return [Config(cfg.pp, cfg.dp, cfg.tp, cfg.m, cfg.mbs, cfg.schedule, cfg.v, cfg.zero, cp=cfg.cp, sp=cfg.sp, rep=r)
            for r in divisors(cfg.dp) if 1 < r < cfg.dp and (pin is None or r == pin)]


def batch_stats_problem(ctx):
    """One line when the pins leave a model normalising by batch statistics no configuration where
    every replica normalises by the whole batch's statistics, as one process does; None otherwise.
    Such a model runs one micro-batch a step (each would otherwise have its own statistics), with
    the statistics synced over dp (emit/dp/batch_stats.py) in whole modules: not in a pipeline stage
    (a traced graph) and not under context parallelism."""
    c = ctx.cons
    if not ctx.batch_stats:
        return None
    why = ("micro_batches must be 1" if c.micro_batches not in (None, 1) else
           "pp > 1 runs with dp = 1 only" if (c.pp or 1) > 1 and (c.dp or 1) > 1 else
           "dp must be 1 (a batch norm of its own class, which the emitter cannot sync)"
           if ctx.batch_stats_unsynced and (c.dp or 1) > 1 else
           "cp must be 1" if (getattr(c, "cp", None) or 1) > 1 else
           f"the schedule {c.schedule!r} needs micro-batches >= stages" if c.schedule in ("interleaved", "dualpipev")
           else None)
    if why is None:
        return None
    if ctx.batch_buffers:
        return (f"buffer {ctx.batch_buffers[0]!r} is written in forward from the batch (an EMA or running statistic), "
                f"which each rank would update from its own part of the batch, so {why.split(' (')[0]}; relax the pins, "
                f"or move the update out of forward")
    return (f"the model normalises by batch statistics (BatchNorm in training mode) over the whole batch, so {why}; "
            f"relax the pins (or train it in eval mode)")


LONG_CONTEXT = 16384     # tokens per sample from which cp is searched in every form it is priced


def _seq(ctx):
    got = ctx.__dict__.get("_seq")            # (once per search: read for every configuration)
    if got is None:
        from .cp import sequence_length
        got = ctx.__dict__["_seq"] = (sequence_length(ctx.graph),)
    return got[0]


def _cp_searched(ctx, c, pp, tp):
    """Whether the free search tries cp > 1 here: from LONG_CONTEXT tokens per sample everywhere;
    below, without a pipeline only (short sequences: cp is one way among several to cut activation
    traffic there, and pipelined cp configurations multiply the space for little: GPT-3 175B on 1024
    A100, 6,648 -> 54,248 configurations, search 1.06 -> 2.35 s CPU, the same plan), unless cp is
    pinned.  sapp run emits every form (sapp/emit/cp/cp.py)."""
    if c.cp is not None:
        return True
    seq = _seq(ctx) or 0
    return seq >= LONG_CONTEXT or pp == 1


def _plain_dp_equivalent(c, dp, cp, mbs):
    """A cp configuration whose micro-batch splits over cp whole samples is dominated: dp·cp plain
    data-parallel replicas at mbs/cp samples run the same tokens per rank, the same gradient-sync
    group and link, the same activations, without the K/V exchange and its saved copies
    (sapp/search/joint/cp.py).  Kept when the pins forbid that dp."""
    if c.dp is not None or (c.max_dp is not None and dp * cp > c.max_dp) or getattr(c, "cp", None) is not None:
        return False
    return mbs % cp == 0


def interleave_values(ctx, pp, m):
    """Virtual chunk counts v to price for pp stages and m micro-batches.  Interleaving needs the
    blocks in one run (glue only at the ends: identical blocks are priced as a contiguous run dealt
    out afterwards, several types over each device's real blocks, interleave.mixed_stages; these
    without Llama 3's glue-only chunks) and at least v blocks on every stage.  Searched: the v that
    divide the L blocks (every stage then holds a multiple of v: equal chunks), with m a multiple
    of pp (the closed form is exact there); pinned: any v from 2 to floor(L / pp) (chunks as equal
    as they go) and any m torch's interleaved 1F1B runs (both priced by the schedule simulator);
    never one whose schedule walks more than schedule.MAX_SCHEDULE_OPS operations."""
    if pp < 2 or not (ctx.uniform or ctx.mixed_blocks):
        return []
    return [v for v in _interleave_values(ctx, pp, m) if not too_long(pp, m, v)]


def _interleave_values(ctx, pp, m):
    k = ctx.L // pp
    pin_v, pin_m = ctx.cons.virtual_chunks, ctx.cons.micro_batches
    if pin_v is not None:
        ok = 2 <= pin_v and _chunks_fit(ctx, pp, pin_v) and (ctx.uniform or ctx.L >= pp * pin_v) and (
            m % pp == 0 or (pin_m is not None and interleave_rounds(pp, m) is not None))
        return [pin_v] if ok else []
    if m % pp and not (pin_m is not None and interleave_rounds(pp, m) is not None):
        return []
    # v dividing the blocks: stages hold multiples of v (equal chunks; the first / last stage may
    # hold fewer), at least one chunk-row of v blocks per stage; and Llama 3's layout, the one v whose
    # pp * v chunks are the blocks plus a chunk for the embedding and one for the head and loss
    # (pp * v - 2 <= L < pp * v; Dubey et al. 2024, section 3.3.2: 126 layers, pp 16, v 8)
    out = [v for v in divisors(ctx.L) if 2 <= v <= k]
    g = ctx.L // pp + 1
    if g >= 2 and g not in out and _chunks_fit(ctx, pp, g) and ctx.uniform:   # (mixed blocks: no glue chunk)
        out.append(g)
    return out


def dualpipev_fits(ctx, pp, m) -> bool:
    """Whether DualPipeV is priced for pp ranks and m micro-batches: torch's ScheduleDualPipeV needs
    m >= 2 pp (pipeline.dualpipe.dualpipev_problem), its 2 pp chunks a block each at least, and, as
    interleaving, the blocks in one run with the other layers only before and after them (identical
    ones priced as a contiguous run dealt into the V afterwards, several types over the blocks each
    device really holds: interleave.mixed_stages)."""
    return (pp >= 2 and (ctx.uniform or ctx.mixed_blocks) and ctx.L >= 2 * pp and dualpipev_problem(pp, m) is None
            and ctx.cons.virtual_chunks in (None, 2))


def dualpipev_why(ctx):
    """Why a pinned dualpipev schedule has no configuration (one line), or None."""
    c = ctx.cons
    if c.schedule != "dualpipev":
        return None
    if not (ctx.uniform or ctx.mixed_blocks):
        return f"schedule 'dualpipev': {chunk_refusal(ctx)}: use 1f1b"
    pps = [c.pp] if c.pp is not None else [p for p in divisors(ctx.cluster.devices) if p > 1]
    if pps and all(ctx.L < 2 * p for p in pps):
        p = min(pps)
        return (f"schedule 'dualpipev' cuts the model in 2 x pp = {2 * p} chunks of at least one block, but it has "
                f"{ctx.L} blocks; use pp <= {ctx.L // 2} or the 1f1b schedule")
    if c.micro_batches is not None and pps and all(dualpipev_problem(p, c.micro_batches) for p in pps):
        return dualpipev_problem(pps[0], c.micro_batches)
    return None


def chunk_refusal(ctx) -> str:
    """Why the chunked schedules cannot deal this model's blocks into chunks (the real remaining cause)."""
    if not ctx._glue_only_at_ends():
        return "needs the blocks in one run with the other layers only before and after them; this model's are not"
    if ctx.stage_pins is not None:
        return "deals the blocks itself; drop the stage map (constraints stages=...)"
    return ("takes one recompute policy for every block (pinned per block here); pin one policy or none "
            "(constraints recompute=...)")


def _chunks_fit(ctx, pp, v):
    """Whether pp stages of v chunks each get their blocks: v a stage, or Llama 3's layout where the
    first / last stage holds v - 1 beside a glue-only chunk (partition.stage_kmins; pinned v only)."""
    from ...pipeline.partition import stage_kmins
    from .interleave import glue_ends
    return stage_kmins(ctx.L, pp, v, *glue_ends(ctx)) is not None


def interleave_problem(ctx):
    """Why a pinned virtual_chunks has no configuration (one line), or None."""
    c = ctx.cons
    v = c.virtual_chunks
    if v is None and c.schedule == "interleaved" and c.micro_batches is not None:
        pps = [c.pp] if c.pp is not None else [p for p in divisors(ctx.cluster.devices) if p > 1]
        long = [too_long(p, c.micro_batches, 2) for p in pps]
        return long[0] if long and all(long) else None
    if v is None or v < 2:
        return None
    if not (ctx.uniform or ctx.mixed_blocks):
        return f"virtual_chunks={v}: interleaving {chunk_refusal(ctx)}"
    pps = [c.pp] if c.pp is not None else [p for p in divisors(ctx.cluster.devices) if p > 1]
    fit = [p for p in pps if _chunks_fit(ctx, p, v) and (ctx.uniform or ctx.L >= p * v)]
    if not fit:
        p = min(pps) if pps else 2
        return (f"virtual_chunks={v} needs at least {v} blocks on each of the pp={p} stages ({v - 1} on the first "
                f"and last beside the embedding / head), but the model's {ctx.L} blocks give {ctx.L // p}; use "
                f"virtual_chunks <= {max(1, (ctx.L + 2) // p)} or fewer stages")
    if c.micro_batches is not None:
        long = [too_long(p, c.micro_batches, v) for p in fit]
        if all(long):
            return f"virtual_chunks={v}: {long[0]}"
        bad = [p for p in fit if interleave_rounds(p, c.micro_batches) is None]
        if bad and len(bad) == len(fit):
            p = bad[0]
            r = max(1, c.micro_batches // p)
            return (f"virtual_chunks={v}: torch's interleaved 1F1B runs m micro-batches over pp stages only when m "
                    f"is a multiple of max(1, m // pp) ({c.micro_batches} over pp={p}: {r}); pin micro_batches "
                    f"to a multiple of {p}")
    return None
