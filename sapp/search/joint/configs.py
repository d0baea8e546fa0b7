"""Enumeration of the (pp, dp, tp, micro-batches, schedule, virtual chunks, ZeRO) configurations the
cluster, the batch and the constraints allow."""
from __future__ import annotations

from ...pipeline.profile import stage_mesh
from .result import Config


def divisors(n):
    """Divisors of n in increasing order, in O(sqrt n) steps (device counts and batches can be huge)."""
    if n < 1:
        return []
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def _sp_options(cons, tp):
    """Sequence parallelism is a choice per tp degree > 1 (off first: ties keep the plain layout)."""
    pin = getattr(cons, "sp", None)
    if tp == 1:
        return (False,) if not pin else ()
    return (pin,) if pin is not None else (False, True)


def enumerate_configs(ctx):
    """Every configuration the cluster, batch and constraints allow (no costs yet)."""
    c, cl = ctx.cons, ctx.cluster
    N, gpn = cl.devices, cl.gpus_per_node
    out = []
    tps = [t for t in divisors(gpn) if (c.tp is None or t == c.tp) and (c.max_tp is None or t <= c.max_tp)]
    for tp in tps:
        if N % tp:
            continue
        for pp in divisors(N // tp):
            if c.pp is not None and pp != c.pp:
                continue
            if pp > 1 and pp > ctx.L:
                continue
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
            for m in divisors(per_rep):
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
                        # a pinned ZeRO stage is what the plan must say: a dp = 1 configuration
                        # (nothing to shard over) would be written as zero 0 beside the pin
                        if c.zero is not None and z != c.zero:
                            continue
                        for sp in _sp_options(c, tp):
                            out.append(Config(pp, dp, tp, m, per_rep // m, s, v, z, sp))
    return out
