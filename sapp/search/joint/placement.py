"""Host placement weighed inside the joint search, and `evaluate_config`: a configuration priced with
the best placement."""
from __future__ import annotations

from ...costmodel.optimizer import updated_params
from ...errors import ConstraintError
from .evaluate import price_config
from .numbers import unit_numbers
from .stage import memory_needed


def evaluate_config(ctx, cfg, prof=None, *, exact=False, policy=None, placement=True):
    """Exact evaluation of one configuration: JointResult, or None if nothing fits.  With
    `placement`, host placements (sapp.placement) are tried where they matter (see _placed)."""
    prof = prof or ctx.profile(cfg.dp, cfg.tp)
    res = price_config(ctx, cfg, prof, exact=exact, policy=policy)
    if res is not None:
        remember_placement(ctx, "device", res)
    if placement and cfg.pp == 1 and (ctx.placement_relevant or res is None):
        if res is None and not ctx.placement_relevant:
            # host placement saves at most the model states: skip when even that cannot fit
            num = unit_numbers(ctx, prof, cfg)
            if memory_needed(ctx, cfg, prof) - sum(num.states) > ctx.cap:
                return None
        res = weigh_placements(ctx, cfg, prof, res, exact, policy)
    return res


def weigh_placements(ctx, cfg, prof, res_dev, exact, policy):
    """Host placement for a single-stage configuration: every option placement_options offers for
    the whole model (device first), each scored by re-running the stage with the device bytes it
    saves and adding its exposed host time; the fastest feasible one wins (device on ties)."""
    from ...placement import placement_options
    num = unit_numbers(ctx, prof, cfg)
    compute = cfg.m * sum(num.t)
    key = (cfg.dp, cfg.tp, cfg.zero, cfg.m, cfg.mbs)
    opts = ctx.placements.get(key)
    if opts is None:
        try:
            opts = placement_options(
                ctx.graph, list(ctx.graph.nodes), ctx.cluster, ctx.settings, dp=cfg.dp, tp=cfg.tp, zero=cfg.zero,
                micro_batches=cfg.m, compute_s=compute, pins=ctx.cons.placement, micro_batch_size=cfg.mbs)
        except ConstraintError:
            # pins this ZeRO stage cannot run (placement refuses them there); another ZeRO stage may
            if ctx.cons.zero is not None:
                raise
            opts = []
        ctx.placements[key] = opts
    best = res_dev if any(o.name == "device" for o in opts) else None
    if best is not None:
        remember_placement(ctx, "device", best)
    for o in opts:
        if o.name == "device":
            continue
        r = price_config(ctx, cfg, prof, exact=exact, policy=policy, cap_extra=o.device_bytes_saved)
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
        remember_placement(ctx, o.name, r)
        if best is None or rank_key(r) < rank_key(best):
            best = r
    return best


def remember_placement(ctx, name, res):
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


def rank_key(res):
    return (res.step_time_s, res.peak_memory_bytes) + res.config.key()
