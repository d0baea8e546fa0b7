"""Lower bounds on a configuration's step time, for branch and bound: analytic (no profile) and from
the stage profile."""
from __future__ import annotations

from ...costmodel.gradsync import overlap_rule
from .interleave import interleave_step
from .numbers import bound_numbers, p2p_time


def analytic_bound(ctx, cfg):
    """Perfectly split compute plus the bubble and the stage-boundary sends: no configuration can be
    faster.  With T_i a stage's per-micro-batch time (its sends included), the schedules' step is
    m tmax + (tsum - tmax) / v (v = 1: GPipe / 1F1B), increasing in tmax and tsum, and tmax >=
    tsum / p, so the step is at least (tsum / p) (m + (p - 1) / v); tsum / p is at least the
    perfectly split compute of a micro-batch plus the average sends per stage."""
    w = ctx.work_per_sample * ctx.B / ctx.cluster.devices
    p, m = cfg.pp, cfg.m
    if p == 1:
        return w
    if cfg.schedule == "dualpipev":
        # its bubble has no closed form (pipeline/dualpipe.py): only the perfectly split work is certain
        return w
    v = cfg.v if cfg.schedule == "interleaved" else 1
    sends = (2 * v * p - 2) / p
    # a device sends its 1/cp of the tokens; under sp its 1/tp shard of them (no gather after)
    nbytes = boundary_per_sample(ctx) * cfg.mbs / cfg.cp
    c = p2p_time(ctx, cfg, nbytes / cfg.tp, replicated=False) if cfg.sp else p2p_time(ctx, cfg, nbytes)
    if v > 1 and interleave_step(ctx, cfg) == 1:
        # chunks as equal as they go (profile_bound): the busiest stage's own work only
        return (w / m + sends * c) * m
    return (w / m + sends * c) * (m + (p - 1) / v)


def boundary_per_sample(ctx):
    """A lower bound on the bytes per sample a stage boundary sends per device: the largest block
    output's batch-proportional part (what the stage profile's `boundary` grows by per sample;
    tensor-parallel ranks each send the whole tensor), computed once per search."""
    got = getattr(ctx, "_boundary_ps", None)
    if got is not None:
        return got
    from ...costmodel.dtypes import ensure_widths, out_bytes
    g = ctx.graph
    ensure_widths(g)
    best = 0.0
    for u in ctx.block_units:
        node = g.nodes[u.nodes[-1]]
        if not node.out.shape:
            continue
        batch = {d.name for d in node.dims if d.batch}
        if not any(d in batch for d in node.out.dims):
            continue
        best = max(best, node.out.numel * out_bytes(node, ctx.settings) / g.batch_size)
    ctx._boundary_ps = best * (1 - 1e-9)
    return ctx._boundary_ps


def profile_bound(ctx, cfg, prof, floor=None):
    """Tighter bound from the profile: real per-micro-batch unit times (no recomputation), the
    stage-boundary sends every pipeline pays, the cheapest possible gradient sync (bandwidth spread
    evenly, latency once; overlapped: the last bucket, at least one block's) and the bubble.
    `floor`: a lower bound on the slowest stage's time per micro-batch (memory_bound.stage_time_floor:
    the recomputation memory forces), folded into the bubble formula, which grows with it."""
    num = bound_numbers(ctx, prof, cfg)
    p, m = cfg.pp, cfg.m
    c = p2p_time(ctx, cfg, num.boundary)
    sends = (2 * cfg.v * p - 2) if cfg.schedule == "interleaved" else 2 * (p - 1)
    dual = cfg.schedule == "dualpipev"
    if dual:    # sends as in the V (stage.send_counts): 4 (p - 1), the busiest device's at least 2
        sends = 4 * (p - 1)
    tot = num.tot + sends * c
    tmax = max(tot / p, num.tmax)
    if p > 1 and ctx.uniform and ctx.stage_pins is None and num.tblock is not None:
        # identical blocks dealt in whole steps (interleaving: rows of v blocks or single blocks,
        # interleave.interleave_step): some stage holds ceil(L / (p step)) steps
        step = interleave_step(ctx, cfg)
        k = -(-ctx.L // (p * step)) * step
        least_sends = 2 * cfg.v - 1 if cfg.schedule == "interleaved" else 2 if dual else 1
        tmax = max(tmax, k * num.tblock + least_sends * c)
    if floor is not None:
        tmax = max(tmax, floor)
        if p == 1:
            tot = max(tot, floor)
    gs = num.gs / p + num.lat
    if overlap_rule(ctx.cluster, cfg.zero, p, cfg.tp, ctx.settings.runtime) != "none":
        # the runtime hides all but its last bucket under backward, and every stage's last bucket
        # holds at least one block's gradients (gradsync.exposed_grad_sync)
        gs = num.gs_block
    gs += ctx.loss_sync_s
    if p == 1:
        return m * tot + gs
    if dual:        # no closed form for its bubble: the busiest device's own work only is certain
        return m * tmax + gs
    if cfg.schedule == "interleaved":
        if p > 1 and interleave_step(ctx, cfg) == 1:      # (blocks of several types: always 1)
            # chunks as equal as they go: a stage's small chunks fill and drain the pipeline faster
            # than the equal-chunk bubble (the schedule simulator's step can sit below it), so only
            # the busiest stage's own work is certain
            return m * tmax + gs
        return m * tmax + (tot - tmax) / cfg.v + gs
    return (m - 1) * tmax + tot + gs

