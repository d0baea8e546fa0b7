"""Interleaved pipelines' block counts: the layouts a configuration's chunks are priced in and the
least blocks per stage (read by the evaluation, the configurations and the bounds)."""
from __future__ import annotations

from ...pipeline.partition import stage_kmins


def glue_ends(ctx):
    """(prologue, epilogue): whether glue (embedding; head and loss) precedes / follows the blocks."""
    return ctx.units[0].kind != "block", ctx.units[-1].kind != "block"


def interleave_steps(ctx, cfg):
    """Blocks per unit of the interleaved count partition, one per layout to price: v (stages hold
    whole rows of v blocks: equal chunks, the closed-form schedule) or 1 (any count >= the stage's
    minimum, chunks as equal as they go, the schedule simulator).  The free search deals its v
    (divisors of the L blocks, at most L / pp) in rows.  A pinned v whose rows do not spread evenly
    over the pp stages (pp * v does not divide L) is also priced as equal as the blocks go, and the
    faster kept: rows there leave some stages a whole row more (Llama-3-405B, 126 blocks, pp 16,
    pinned v 7: 14 stages of 7 blocks and 2 of 14, 21.1 s against 13.4 s at 7 / 8 blocks a stage)."""
    if cfg.schedule != "interleaved" or cfg.v <= 1 or ctx.L % cfg.v or ctx.L < cfg.pp * cfg.v:
        return (1,)
    if ctx.cons.virtual_chunks is not None and ctx.L % (cfg.pp * cfg.v):
        return (cfg.v, 1)
    return (cfg.v,)


def interleave_step(ctx, cfg):
    """The finest of interleave_steps, which the bounds assume (bounds.profile_bound, memory_bound):
    single blocks reach every count rows of v reach, so their bound holds for both layouts."""
    return min(interleave_steps(ctx, cfg))


def interleave_kmins(ctx, cfg):
    """Least blocks per stage under interleaving (partition.stage_kmins): v, or on the first / last
    stage v - 1 with a glue-only chunk where the pinned v asks for more chunks than the blocks give."""
    return stage_kmins(ctx.L, cfg.pp, cfg.v, *glue_ends(ctx)) or cfg.v
