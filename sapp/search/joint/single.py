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
    if not any(c == cfg for c in enumerate_configs(ctx)):
        return False, None
    return True, evaluate_config(ctx, cfg, ctx.profile(cfg.dp_cp, cfg.tp, cfg.sp))
