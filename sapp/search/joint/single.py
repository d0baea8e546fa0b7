"""Pricing one given configuration (what `sapp.evaluate` re-scores a plan with), outside the search."""
from __future__ import annotations

import math

from .configs import enumerate_configs
from .context import SearchContext
from .placement import evaluate_config


def score_config(graph, cluster, global_batch, cons, settings, cfg, *, fixed_strategies=None, search_fn=None):
    """(allowed, result) for exactly `cfg` under the pins `cons`, capacity ignored (a plan that does
    not fit is reported, not refused).  `allowed` is False when the cluster, batch and pins do not
    admit `cfg`; `result` is None when its stages cannot be priced.  Not joint_search: its
    enumeration leaves out interleaved schedules when blocks carry different recompute pins, which
    every interleaved plan with per-block recomputation has.  `search_fn`: the tp level's sharding
    search where no splits are fixed (an engine's configuration: api.tp_search_fn, as searched)."""
    ctx = SearchContext(graph, cluster, global_batch, cons, settings, search_fn)
    ctx.fixed = fixed_strategies
    ctx.cap = math.inf
    cons.check(cluster.devices, cluster.gpus_per_node, ctx.block_names, global_batch)
    if cfg.schedule in ("interleaved", "dualpipev"):
        # the pins are on the contiguous names the evaluator prices; interleaving (and DualPipeV's V) needs identical
        # blocks, which the pins do not change
        ctx.uniform = len({u.rep for u in ctx.block_units}) == 1 and ctx._glue_only_at_ends()
        ctx.mixed_blocks = not ctx.uniform and ctx._glue_only_at_ends()
        if ctx.mixed_blocks and ctx.policy_pins and ctx.stage_pins is not None:
            ctx.policy_pins = _real_pins(ctx, cfg)
    if not any(c == cfg for c in enumerate_configs(ctx)):
        return False, None
    return True, evaluate_config(ctx, cfg, ctx.profile(cfg.dp_cp, cfg.tp, cfg.sp))


def _real_pins(ctx, cfg):
    """The recompute pins moved back to the real blocks: a chunked plan's pins are read back on the
    contiguous names (api/from_plan._interleaved_rename), but blocks of several types are priced
    over the blocks each device really holds (interleave.mixed_stages)."""
    from ...pipeline.partition import dualpipev_layout, interleaved_layout
    flat, p = ctx.block_names, cfg.pp
    counts = [sum(1 for s in ctx.stage_pins if s == i) for i in range(p)]
    layout = dualpipev_layout if cfg.schedule == "dualpipev" else interleaved_layout
    real, pos = {i: [] for i in range(p)}, 0
    for i, _, n in layout(counts, cfg.v):
        real[i].extend(flat[pos:pos + n])
        pos += n
    out, pos = dict(ctx.policy_pins), 0
    for i in range(p):
        for q, b in enumerate(real[i]):
            out[b] = ctx.policy_pins.get(flat[pos + q], out.get(b))
        pos += counts[i]
    return out
