"""Lower bounds on a configuration's step time, for branch and bound: analytic (no profile) and from
the stage profile."""
from __future__ import annotations

from .numbers import bound_numbers, p2p_time


def analytic_bound(ctx, cfg):
    """Perfectly split compute plus the bubble: no configuration can be faster."""
    w = ctx.work_per_sample * ctx.B / ctx.cluster.devices
    p, m = cfg.pp, cfg.m
    if p == 1:
        return w
    if cfg.schedule == "interleaved":
        return w * (1 + (p - 1) / (cfg.v * m))
    return w * (1 + (p - 1) / m)


def profile_bound(ctx, cfg, prof):
    """Tighter bound from the profile: real per-micro-batch unit times (no recomputation), the
    stage-boundary sends every pipeline pays, the cheapest possible gradient sync (bandwidth spread
    evenly, latency once) and the bubble."""
    num = bound_numbers(ctx, prof, cfg)
    p, m = cfg.pp, cfg.m
    c = p2p_time(ctx, cfg, num.boundary)
    sends = (2 * cfg.v * p - 2) if cfg.schedule == "interleaved" else 2 * (p - 1)
    tot = num.tot + sends * c
    tmax = max(tot / p, num.tmax)
    gs = num.gs / p + num.lat
    if p == 1:
        return m * tot + gs
    if cfg.schedule == "interleaved":
        return m * tmax + (tot - tmax) / cfg.v + gs
    return (m - 1) * tmax + tot + gs
