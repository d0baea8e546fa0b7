"""Exact evaluation of one configuration on the device alone: stage partition, schedule, gradient
sync, optimizer update."""
from __future__ import annotations

from ...costmodel.batchstats import batch_stats_sync_time
from ...costmodel.gradsync import exposed_grad_sync, overlap_rule
from ...costmodel.optimizer import optimizer_step_time
from ...pipeline.partition import chunk_counts, partition_counts, partition_dp, stage_end
from ...pipeline.profile import cut_at_block_entry
from ...pipeline.schedule import step_time
from .copies import tie_sync_s
from .interleave import interleave_kmins, interleave_steps, mixed_chunked, mixed_stages
from .partition_bound import partition_bounded
from .result import JointResult
from .stage import StageEvaluator


def price_config(ctx, cfg, prof, *, exact=False, policy=None, cap_extra=0.0):
    """The configuration priced (JointResult), None where it does not fit.  Interleaved with a pinned
    v there may be two layouts to price (interleave_steps): the faster is kept."""
    best = None
    for step in interleave_steps(ctx, cfg):
        r = _price(ctx, cfg, prof, exact, policy, cap_extra, step)
        if r is not None and (best is None or r.step_time_s < best.step_time_s):
            best = r
    return best


def _price(ctx, cfg, prof, exact, policy, cap_extra, step):
    ev = StageEvaluator(ctx, cfg, prof, policy, cap_extra)
    p = cfg.pp
    got = mixed_stages(ctx, ev, cfg) if mixed_chunked(ctx, cfg) else _stages(ctx, ev, cfg, exact, step)
    if got is None:
        return None
    stages, held, shares, ranges, cuts = got
    rule = overlap_rule(ctx.cluster, cfg.zero, p, cfg.tp, ctx.settings.runtime)
    for st, idx in zip(stages, held):
        if rule != "none":
            st.grad_sync_s = _exposed_sync(ev, rule, st, idx=idx)
        st.grad_sync_s += step_copies(ev, idx)
    fw = [s.fwd_s for s in stages]
    bw = [s.bwd_s for s in stages]
    # each stage's own sends (forward after its last unit, backward before its first)
    sends = [tuple(x[0] for x in ev.send_pair(i, a, b)) for i, (a, b) in enumerate(cuts)]
    step_pipe = step_time(fw, bw, cfg.m, cfg.schedule if p > 1 else "1f1b", cfg.v, sends, chunk_shares=shares)
    gs = max(s.grad_sync_s for s in stages)
    # the optimizer update runs after the last backward on every stage; the slowest one counts.
    # Its dispatch is per parameter tensor: ZeRO-1 partitions whole tensors over dp; ZeRO-2/3
    # (FSDP2) and tensor parallelism hold every tensor as a sharded DTensor.
    # (a tp level that shards nothing leaves plain parameters: fused Adam, as the emitter runs it)
    sharded = cfg.zero >= 2 or (cfg.tp > 1 and tp_shards(prof))
    opt_s = max(optimizer_step_time(s.memory["optimizer"], s.memory["params"], ctx.cluster, ctx.settings,
                                    tensors=s.param_tensors / (cfg.dp_cp if cfg.zero == 1 else 1), sharded=sharded)
                for s in stages)
    loss_s = ctx.loss_sync_s
    # batch statistics synced over dp, per micro-batch on the critical path (costmodel.batchstats)
    bn_s = (cfg.m * batch_stats_sync_time(ctx.bn_channels, cfg.dp, dp_link(ctx.cluster, cfg), ctx.cluster)
            if ctx.bn_channels and cfg.dp > 1 else 0.0)   # (the search's hot path: most models have none)
    # the gradients of weights several stages hold copies of, summed between those stages (copies.py)
    tie_s = tie_sync_s(ctx, cfg, ev.copies, ranges) if ev.copies else 0.0
    step = step_pipe + gs + opt_s + loss_s + bn_s + tie_s
    T = [s.fwd_s + s.bwd_s + s.send_s for s in stages]
    busy = cfg.m * max(T)
    compute_like = cfg.m * max(s.fwd_s + s.bwd_s for s in stages)
    res = JointResult(cfg, step, stages)
    res.overlap = rule
    # the plan's record: the most one device sends per forward / backward send over its boundaries
    res.scatter_gather = ev.sg if p > 1 else False
    res.boundary_bytes = max((s.send_bytes[0] for s in stages), default=0.0) if p > 1 else 0.0
    res.boundary_grad_bytes = max((s.send_bytes[1] for s in stages), default=0.0) if p > 1 else 0.0
    res.bubble_s = max(0.0, step_pipe - busy)
    res.grad_sync_s = gs
    res.p2p_s = cfg.m * max(s.send_s for s in stages)
    # tensor-parallel resharding is priced inside the units' fwd/bwd; report it as communication
    by_name = {u.name: u for u in prof.units}
    tp_comm = cfg.m * max(sum(by_name[n].reshard_at(cfg.mbs / cfg.cp) for n in s.units if n in by_name) for s in stages)
    res.optimizer_s = opt_s
    res.compute_s = compute_like + opt_s - tp_comm
    res.comm_s = gs + res.p2p_s + tp_comm + loss_s + bn_s + tie_s
    res.comm_by_kind = {"reshard": tp_comm, "dp_grad_sync": gs, "pp_p2p": res.p2p_s, "loss_sync": loss_s}
    if tie_s:
        res.comm_by_kind["pp_tied_grads"] = tie_s
    if bn_s:
        res.comm_by_kind["batch_stats_sync"] = bn_s
    res.peak_memory_bytes = max(s.memory_bytes for s in stages)
    res.capacity_bytes = ctx.cap
    res.model_flops = ctx.model_flops_per_sample * ctx.B
    res.mfu = res.model_flops / (step * ctx.cluster.devices * ctx.cluster.peak_flops) if step > 0 else 0.0
    res.profile = prof
    return res


def _stages(ctx, ev, cfg, exact, step):
    """(stages, each stage's units, chunk shares or None, the tied-weight ranges (copies.tie_sync_s),
    each stage's (a, b)) of the contiguous partition, or None.  Chunked schedules of identical blocks
    are priced as contiguous runs and renamed to the real layout (_interleave_blocks)."""
    n = ev.n
    starts = _partition(ctx, ev, cfg, exact, step)
    if starts is None:
        return None
    ends = starts[1:] + [n]
    stages = [ev.seg(i, a, b, detail=True) for i, (a, b) in enumerate(zip(starts, ends))]
    if any(s is None for s in stages):
        return None
    shares = None
    if cfg.schedule in ("interleaved", "dualpipev") and cfg.v > 1:
        shares = [_chunk_shares(ev, cfg, s, a, b) for s, a, b in zip(stages, starts, ends)]
        _interleave_blocks(ctx, cfg, stages)
        for st, sh in zip(stages, shares):
            st.chunk_shares = sh
    held = [ev.device_units(st.index, a, b) for st, a, b in zip(stages, starts, ends)]
    ranges = list(zip(starts, ends))
    if ev.v_tail is not None:       # dualpipev: the head and loss on rank 0 (ranges[p]: p % p = 0)
        ranges[-1:] = [(starts[-1], ev.v_tail), (ev.v_tail, n)]
    return stages, held, shares, ranges, list(zip(starts, ends))


def dp_link(cluster, cfg) -> str:
    """The dp group's link: inter-node when a stage's dp x cp x tp ranks span nodes (pipeline.profile.stage_mesh)."""
    return "inter" if cfg.dp_cp * cfg.tp > cluster.gpus_per_node else "intra"


def step_copies(ev, a, b=None, i=None):
    """Seconds a step of the once-a-step FSDP2 copies a torchtitan profile runs on the compute stream
    for units [a, b) (Unit.zcopy, costmodel.gradsync.fsdp_exposed_copies): beside the exposed gradient
    sync, never overlapped.  `i`: the stage's device (StageEvaluator.device_units: dualpipev's V);
    `a` alone: the device's units themselves."""
    idx = a if b is None else range(a, b) if i is None else ev.device_units(i, a, b)
    return sum(ev.units[j].zcopy.get(ev.cfg.zero, (0.0, 0.0, 0.0))[2] for j in idx)


def _exposed_sync(ev, rule, st, a=None, b=None, idx=None):
    """The stage's gradient sync left exposed by what the runtime overlaps (costmodel.gradsync): the
    last bucket is the stage's glue (FSDP2's root unit) and its first block; the rest runs under
    the last micro-batch's backward.  `idx`: the device's units (else those of [a, b))."""
    num, units = ev.num, ev.units
    idx = ev.device_units(st.index, a, b) if idx is None else idx
    first_block = next((j for j in idx if units[j].kind == "block"), None)
    last = sum(num.gs[j] for j in idx if units[j].kind != "block" or j == first_block)
    return exposed_grad_sync(rule, sum(num.gs[j] for j in idx), max((num.lat[j] for j in idx), default=0.0),
                             st.bwd_s, last, st.memory.get("grads", 0.0), forward_s=st.fwd_s, zero=ev.cfg.zero)


def _chunk_shares(ev, cfg, st, a, b):
    """Fractions of stage st's time its v chunks take: chunk c holds chunk_counts(k, v)[c] of its k
    identical blocks.  The prologue / epilogue are spread over the chunks as the closed form does
    (the real layout puts them on the model's first and last chunk): equal chunks, the closed form;
    unequal ones (a pinned v that does not divide the blocks), the simulator.  A glue-only chunk
    (Llama 3's layout, partition.stage_kmins) takes the glue's own time, the others their blocks'."""
    k = sum(1 for j in range(a, b) if ev.units[j].kind == "block")
    counts = chunk_counts(k, cfg.v, stage_end(st.index, cfg.pp))
    if 0 not in counts:
        return [n / k for n in counts]
    t = [ev.num.t[j] for j in range(a, b)]
    glue = sum(x for x, j in zip(t, range(a, b)) if ev.units[j].kind != "block")
    per_block = (sum(t) - glue) / k
    total = sum(t)
    return [(n * per_block if n else glue) / total for n in counts]


def _interleave_blocks(ctx, cfg, stages):
    """Priced as contiguous runs of blocks (identical blocks, so the numbers are the same); the real
    interleaved layout gives device i the chunks c * pp + i (partition.interleaved_layout), DualPipeV's
    the chunks i and 2 pp - 1 - i (partition.dualpipev_layout).  Rename
    the blocks to the real ones, in chunk order, and record the chunk sizes."""
    from ...pipeline.partition import dualpipev_layout, interleaved_layout
    flat = ctx.block_names
    real = {st.index: [] for st in stages}
    pos = 0
    layout = dualpipev_layout if cfg.schedule == "dualpipev" else interleaved_layout
    for i, _, n in layout([len(st.blocks) for st in stages], cfg.v):
        real[i].extend(flat[pos:pos + n])
        pos += n
    for st in stages:
        pols = [st.recompute.get(b, "none") for b in st.blocks]
        st.chunks = chunk_counts(len(st.blocks), cfg.v, stage_end(st.index, cfg.pp))
        st.recompute = dict(zip(real[st.index], pols))
        st.blocks = real[st.index]


def _partition(ctx, ev, cfg, exact, step=1):
    n, p = ev.n, cfg.pp
    if ctx.stage_pins is not None:
        return _pinned_starts(ctx, ev, p)
    if p == 1:
        return [0] if ev.seg(0, 0, n)[1] else None
    units = ev.units
    inter = cfg.schedule in ("interleaved", "dualpipev") and cfg.v > 1
    if ctx.uniform and (not exact or inter):
        # (interleaved: identical blocks, checked when enumerating).  Interleaving splits each stage
        # into v chunks: `step` v deals whole rows of v blocks (equal chunks), 1 any count >= the
        # stage's minimum, chunks as equal as they go (interleave_steps)
        first = next(i for i, u in enumerate(units) if u.kind == "block")
        pre, post = first, n - first - ctx.L
        kmin = interleave_kmins(ctx, cfg) if inter and step == 1 else 1

        def seg_k(i, k):
            # identical blocks: only the count matters, plus the glue on the first / last stage
            k *= step
            if i == 0:
                return ev.seg(0, 0, pre + k)
            if i == p - 1:
                return ev.seg(i, n - post - k, n)
            return ev.seg(i, pre, pre + k)
        counts, _ = partition_counts(ctx.L // step, p, seg_k, kmin=kmin)
        if counts is None:
            return None
        return _starts_from_counts(units, [k * step for k in counts])
    cut = [u.cut_before for u in units]
    cut[0] = False
    if cut_at_block_entry(ev.prof):
        # sequence parallelism cut at the first block's entry runs on that block's stage (emit/sp.py
        # block_scatter): a boundary before it would send the whole activation, priced as the 1/t shard
        cut[next(i for i, u in enumerate(units) if u.kind == "block")] = False
    if exact:          # the reference: the plain O(p n^2) program
        return partition_dp(n, p, [True] + cut[1:], ev.seg)[0]
    # the plain program's starts, pricing only the segments its bounds leave able to matter
    return partition_bounded(ev, n, p, [True] + cut[1:])


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


def tp_shards(prof):
    """Whether the profile's tp level splits any operator (cached on the profile)."""
    got = getattr(prof, "_tp_shards", None)
    if got is None:
        roles = tuple(prof.roles or ())
        ti = roles.index("tp") if "tp" in roles else None
        got = ti is not None and any(len(s) > ti and s[ti] is not None for s in prof.strategies.values())
        prof._tp_shards = got
    return got
