"""Host placement weighed inside the joint search, and `evaluate_config`: a configuration priced with
the best placement."""
from __future__ import annotations

from ...costmodel.optimizer import updated_params
from ...errors import ConstraintError
from .evaluate import price_config
from .numbers import unit_numbers
from .memory_bound import memory_floor, memory_needed


def evaluate_config(ctx, cfg, prof=None, *, exact=False, policy=None, placement=True):
    """Exact evaluation of one configuration: JointResult, or None if nothing fits.  With
    `placement`, every host placement the model offers (sapp.placement) is weighed, for any pipeline
    depth, unless a bound shows it cannot beat the device: placement only frees memory (less
    recomputation), moves optimizer work to the host and adds exposed host time."""
    prof = prof or ctx.profile(cfg.dp_cp, cfg.tp, cfg.sp)
    # the exact partition only where no lower bound already shows the device cannot hold it
    hopeless = memory_floor(ctx, cfg, prof) > ctx.cap * (1 + 1e-6)
    res = None if hopeless else price_config(ctx, cfg, prof, exact=exact, policy=policy)
    if res is not None and res.peak_memory_bytes > ctx.cap * (1 + 1e-9):
        # a safety net: the partition's fit test and the stages' priced memory share one model
        # (recompute/ordered.py); when they disagreed (ZeRO-3's front-block gathers, fixed) a plan
        # came back over capacity (Llama-3-405B pp8 dp256, 78.08 of 77.60 GB).  Never return one
        res = None
    if res is not None:
        remember_placement(ctx, "device", res)
    if not placement or cfg.cp > 1:        # host placement is not emitted beside context parallelism
        return res
    if res is None and not ctx.placement_relevant:
        # host placement saves at most the model states: skip when even that cannot fit
        num = unit_numbers(ctx, prof, cfg)
        if memory_needed(ctx, cfg, prof) - sum(num.states) / cfg.pp > ctx.cap:
            return None
    opts = [o for o in _model_options(ctx, cfg, prof) if o.name != "device"]
    lim = ctx.cons.limits
    if lim is not None:             # a target engine runs only the host placements it can state
        opts = [o for o in opts if o.name in lim["host"]]
        if not opts:
            return res
    if res is not None and not ctx.cons.placement:
        floor = _placement_floor(ctx, cfg, prof, res)
        opts = [o for o in opts if floor + (o.extra_time_s if cfg.pp == 1 else 0.0) < res.step_time_s]
        if not opts:
            return res
    return weigh_placements(ctx, cfg, prof, res, exact, policy, opts)


def _placement_floor(ctx, cfg, prof, res):
    """No placement of this configuration is faster than this (before its exposed host time).  One
    stage: the device result less all its recomputation and its whole optimizer update (the stage's
    base time is fixed); a pipeline may also re-partition with the freed memory: the profile bound."""
    if cfg.pp == 1:
        return res.step_time_s - cfg.m * sum(s.recompute_s for s in res.stages) - res.optimizer_s
    from .bounds import profile_bound
    return profile_bound(ctx, cfg, prof)


def _model_options(ctx, cfg, prof):
    """placement_options for the whole model at this configuration (cached), [] where pins ask for
    what this ZeRO stage cannot run."""
    from ...placement import placement_options
    key = (cfg.dp, cfg.tp, cfg.zero, cfg.m, cfg.mbs, getattr(prof, "sp", False))
    opts = ctx.placements.get(key)
    if opts is None:
        num = unit_numbers(ctx, prof, cfg)
        try:
            opts = placement_options(
                ctx.graph, list(ctx.graph.nodes), ctx.cluster, ctx.settings, dp=cfg.dp, tp=cfg.tp, zero=cfg.zero,
                micro_batches=cfg.m, compute_s=cfg.m * sum(num.t), pins=ctx.cons.placement, micro_batch_size=cfg.mbs,
                device_split=table_split(ctx, prof), engine_offloads=engine_offloads(ctx))
        except ConstraintError as e:
            # pins this ZeRO stage cannot run (placement refuses them there); another ZeRO stage may
            if ctx.cons.zero is not None:
                raise
            ctx.pin_error = str(e)      # said instead of "nothing fits" if no configuration honours them
            opts = []
        ctx.placements[key] = opts
    return opts


def engine_offloads(ctx):
    """Whether the target engine runs the optimizer offload itself (DeepSpeed: TARGETS' host list), so
    the ZeRO stages sapp's emitter cannot offload under (1 and 3) are offered for it."""
    lim = ctx.cons.limits
    return bool(lim) and "optimizer-host" in lim["host"]


def host_offload_possible(ctx, cfg, prof):
    """Whether some host placement of this configuration may move gradients and optimizer states off
    the device (then only the parameters surely stay: the memory bounds count those)."""
    return any(o.name != "device" for o in _model_options(ctx, cfg, prof))


def table_split(ctx, prof):
    """param -> the ways the stage's tp level splits it (1 where its owner's tp split is not one of its
    dims: replicated on every tp rank), for the parameters the profile's layout prices; None without tp."""
    # (computed once per profile: the search asks it for every configuration and stage it weighs)
    if "_table_split" in prof.__dict__:
        return prof._table_split
    roles = tuple(prof.roles or ())
    if "tp" not in roles or not prof.strategies:
        prof._table_split = None
        return None
    ti, tp = roles.index("tp"), prof.tp
    blocks = ctx.graph.blocks
    out = {}
    for name, b, pos, pdims in ctx.owned_params:
        # a block's nodes share its representative's strategies (pipeline/template.template_map)
        rep = prof.rep_of.get(b, b) if b is not None else None
        strat = prof.strategies.get(name if rep == b else blocks[rep][pos])
        d = strat[ti] if strat is not None and len(strat) > ti else None
        for p, dims in pdims:
            out[p] = tp if d is not None and (dims is None or d in dims) else 1
    prof._table_split = out
    return out


def _stage_options(ctx, cfg, prof, res, name):
    """The option `name` for every stage of the pipeline `res` (each stage places its own
    parameters, over its own compute), or None when a stage has no such option or it does not fit."""
    from ...placement import placement_options
    nodes_of = {u.name: u.nodes for u in prof.units}
    out = []
    for st in res.stages:
        names = [n for u in st.units for n in nodes_of.get(u, ())]
        opts = placement_options(ctx.graph, names, ctx.cluster, ctx.settings, dp=cfg.dp, tp=cfg.tp, zero=cfg.zero,
                                 micro_batches=cfg.m, compute_s=cfg.m * (st.fwd_s + st.bwd_s),
                                 micro_batch_size=cfg.mbs, device_split=table_split(ctx, prof),
                                 engine_offloads=engine_offloads(ctx), streamed=cfg.schedule != "dualpipev")
        o = next((o for o in opts if o.name == name), None)
        if o is None or st.memory_bytes - o.device_bytes_saved > ctx.cap * (1 + 1e-9):
            return None
        out.append(o)
    return out


def weigh_placements(ctx, cfg, prof, res_dev, exact, policy, candidates=None):
    """Every placement the model offers (device first; or the non-device `candidates`), each scored by re-running the partition with
    the device bytes it saves per stage and adding its exposed host time (the slowest stage's); the
    fastest feasible one wins (device on ties).  A pipeline places per stage (placement_options on
    the stage's operators, sections merged); it offers optimizer offload only: its stages are traced
    modules, with no nn.Embedding left to keep on the host (sapp/emit)."""
    from ...placement import PlacementOption, merge_sections
    opts = _model_options(ctx, cfg, prof)
    best = res_dev if any(o.name == "device" for o in opts) else None
    for o in (opts if candidates is None else candidates):
        if o.name == "device" or (cfg.pp > 1 and "embedding" in o.name):
            continue
        r = price_config(ctx, cfg, prof, exact=exact, policy=policy, cap_extra=o.device_bytes_saved / cfg.pp)
        if r is None:
            continue
        per_stage = [o] if cfg.pp == 1 else _stage_options(ctx, cfg, prof, r, o.name)
        if per_stage is None:
            continue
        if cfg.pp > 1:
            o = PlacementOption(o.name, min(x.device_bytes_saved for x in per_stage),
                                max(x.extra_time_s for x in per_stage), max(x.host_bytes for x in per_stage),
                                merge_sections([x.section for x in per_stage]))
        # the host now updates what it holds: drop that share of the device update time (the stage
        # that keeps the largest share on the device still sets it)
        moved = r.optimizer_s * min(_offloaded_share(x, st, r.config.tp, ctx) for x, st in zip(per_stage, r.stages))
        r.step_time_s += o.extra_time_s - moved
        r.compute_s -= moved
        r.optimizer_s -= moved
        r.host_s = o.extra_time_s
        r.placement = o
        for x, st in zip(per_stage, r.stages):
            st.memory["host_offload"] = -x.device_bytes_saved
        r.peak_memory_bytes = max(st.memory_bytes for st in r.stages)
        if r.peak_memory_bytes > ctx.cap * (1 + 1e-9):
            continue
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


def _offloaded_share(option, stage, tp, ctx):
    """Share of a stage's device optimizer update no longer spent once `option` updates some of its
    parameters on the host: the offloaded dense parameters and the host tables."""
    comp = option.section.get("predicted", {}).get("components", {})
    n_host = comp.get("optimizer", {}).get("params_on_host", 0.0)
    for t in comp.get("embedding", {}).get("tables", {}).values():
        n_host += t["rows"] * t["dim"] / tp
    n_dev = updated_params(stage.memory["optimizer"], stage.memory["params"], ctx.settings)
    if n_dev <= 0:
        return 0.0
    return min(1.0, n_host / n_dev)


def rank_key(res):
    return (res.step_time_s, res.peak_memory_bytes) + res.config.key()
