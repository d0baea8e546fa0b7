"""Expert parallelism in the joint search: which ep each configuration may take, and what it changes
in a block's priced numbers (sapp/costmodel/moe.py's `ep_unit_delta` on the facts read off the
captured graph).

ep is a dimension beside dp: it divides a stage's dp ranks (EP groups of ep consecutive dp ranks) and
the expert count.  Offered where the emitter runs it (sapp/emit/ep/experts.py): tensor parallelism 1
(experts at expert-TP 1 and attention unsplit) and ZeRO-0/1 (expert gradients all-reduced over the
expert-DP group, the rest over dp; ZeRO-1 shards the experts' optimizer states over expert-DP); and,
under --target megatron only, beside tp > 1 with sequence parallelism as Megatron-LM runs it (experts
split over the tp ranks: expert-tp = tp; costmodel/moe.py prices it, sapp run refuses it)."""
from __future__ import annotations

import dataclasses

from ...errors import ConstraintError
from ...costmodel.moe import ep_unit_delta, paired_hidden
from ...pipeline.overlap import overlap_problem, paired_fraction


def moe_facts(ctx) -> dict:
    """{block name: per-sample MoE facts} for every block holding grouped expert GEMMs, cached on ctx.
    Per sample: routed rows (tokens x top-k) sent, the row width (hidden), expert GEMM forward FLOPs,
    expert parameters; and the expert count and top-k."""
    facts = getattr(ctx, "_moe_facts", None)
    if facts is not None:
        return facts
    g, facts = ctx.graph, {}
    B = max(1, g.batch_size)
    routing = model_routing(g)
    # FP8 dispatch is an engine's (DeepSeek-V3's, Megatron-Core's --moe-router-dtype / TE): sapp/emit/ep's
    # all-to-all sends bf16, so under the eager runtime (sapp run's) it is priced at bf16
    routing["dispatch_fp8"] = routing["dispatch_fp8"] and ctx.settings.runtime != "eager"
    for block, names in (g.blocks or {}).items():
        nodes = [g.nodes[n] for n in names if n in g.nodes]
        gemms = [n for n in nodes if n.extra.get("experts") and _runs_ep(g, n)]
        if not gemms:
            continue
        first = gemms[0]
        # the expert choice, not a group-limited router's group choices (models/moe.py: topk over groups)
        topk = [n for n in nodes if ".topk" in n.target]
        topk = [n for n in topk if n.operands and n.operands[0].shape and
                n.operands[0].shape[-1] == first.extra["experts"]] or topk
        rows = first.dim("b0").size
        k = topk[0].out.shape[-1] if topk and getattr(topk[0], "out", None) is not None else None
        if k is None:
            k = _topk_from_dims(topk[0]) if topk else 1
        # a block with several MoE layers sends every layer's rows: count rows per layer pair
        layers = max(1, len(gemms) // 2)
        h = first.dim("k").size
        # elements a routed row keeps for backward in the ffn width, per layer: the up/gate GEMMs'
        # outputs (the activation's input) and the down GEMM's input (the activation's output)
        row_elems = sum(n.dim("n").size for n in gemms if n.dim("n").size != h) + \
            sum(n.dim("k").size for n in gemms if n.dim("k").size != h)
        down = sum(n.dim("k").size for n in gemms if n.dim("k").size != h)      # the activation's output
        facts[block] = {"rows": rows * layers / B, "hidden": h, "top_k": int(k), "ffn_row_elems": row_elems / layers,
                        "act_out_share": down / row_elems if row_elems else 0.0,
                        "gemms": [_gemm_bytes(n, B, ctx.settings) for n in gemms], **routing,
                        "gemm_elems": [_gemm_elems(n, B) for n in gemms],     # FP8 experts (costmodel/fp8.py)
                        "experts": int(first.extra["experts"]),
                        "expert_flops": sum(n.flops for n in gemms) / B,
                        "expert_params": float(sum(n.dim("e").size * n.dim("k").size * n.dim("n").size
                                                   for n in gemms)),
                        "capacity_factor": float(g.meta.get("moe_capacity_factor", 0.0) or 0.0)}
    ctx._moe_facts = facts
    return facts


def model_routing(g) -> dict:
    """What the model says of its routing (a zoo MoE's config, capture's meta "config"): group-limited
    routing (DeepSeek-V3's n_group / topk_group: a token's experts on at most topk_group of n_group
    expert groups, the groups laid out over the EP group's nodes) and whether its dispatch sends FP8
    (costmodel/moe.py's module text)."""
    cfg = (g.meta or {}).get("config") or {}
    return {"n_group": int(cfg.get("n_group", 0) or 0), "topk_group": int(cfg.get("topk_group", 0) or 0),
            "dispatch_fp8": bool(cfg.get("dispatch_fp8", False))}


def _gemm_bytes(node, B, settings) -> tuple:
    """(forward FLOPs a sample, weight bytes, other bytes a sample) of an expert GEMM as the profile
    prices it (costmodel.nodes.local_bytes at the captured batch B)."""
    from ...costmodel.nodes import local_bytes
    total = local_bytes(node, {}, settings)
    wb = sum(o.numel for o in node.operands if o.param is not None) * settings.weight_bytes
    return node.flops / B, wb, max(0.0, total - wb) / B


def _gemm_elems(node, B) -> tuple:
    """(X, Y) elements a sample of an expert GEMM: the routed rows in and out (FP8 casts, costmodel/moe.py)."""
    x = sum(o.numel for o in node.operands if o.param is None and len(o.shape) >= 2)
    return x / B, node.out.numel / B


def _runs_ep(g, node) -> bool:
    """Whether the emitter can spread `node`'s experts: it sits in a MoE layer of sapp's contract
    (capture lists them in meta "ep_modules"; a graph built without capture lists none and keeps
    every grouped GEMM).  An HF MoE's grouped experts (Mixtral, PhiMoE, ...) are priced whole on each
    rank, as they run: the search used to give them ep = 2, which sapp run then refused."""
    mods = g.meta.get("ep_modules")
    if mods is None:
        return True
    return any(node.module == m or node.module.startswith(m + ".") for m in mods)


def _topk_from_dims(node):
    """top-k's k: the last output axis of the topk node (dims a0, a1, ...)."""
    last = [d for d in node.dims if d.name.startswith("a")]
    return last[-1].size if last else 1


def ep_configs(ctx, cfg) -> list:
    """cfg with each expert-parallel degree > 1 it may take (none for dense models)."""
    facts = moe_facts(ctx)
    if not facts or cfg.zero > 1 or cfg.dp < 2 or (cfg.tp != 1 and not expert_tp_ok(ctx, cfg)):
        return []
    E = min(f["experts"] for f in facts.values())
    pin = ctx.cons.ep
    out = [dataclasses.replace(cfg, ep=e) for e in range(2, cfg.dp + 1)
           if cfg.dp % e == 0 and E % e == 0 and (pin is None or e == pin)]
    if ctx.settings.moe_a2a_overlap:        # the configurations Megatron-Core runs the overlap at
        out = [c for c in out if overlap_on(ctx, c)]
    if cfg.tp == 1:
        return out
    # Megatron's --expert-tensor-parallel-size 1: experts whole on each of the ep x tp ranks (E/(ep tp) each)
    etp = getattr(ctx.cons, "etp", None)
    whole = [dataclasses.replace(c, etp=1) for c in out if E % (c.ep * cfg.tp) == 0] if etp in (None, 1) else []
    return whole + (out if etp in (None, 0) else [])


def expert_tp_ok(ctx, cfg) -> bool:
    """ep beside tp > 1: Megatron-LM runs it (experts split over the tp ranks, --expert-tensor-parallel-size
    = tp, with sequence parallelism, which Megatron requires there); sapp's emitter does not (sapp run
    refuses such a plan in one line, sapp/emit/ep/experts.py), so it is offered under --target megatron only."""
    return getattr(ctx.cons, "target", None) == "megatron" and cfg.sp


def unit_delta(ctx, unit, cfg) -> dict:
    """What ep changes in `unit`'s numbers under cfg (zeros for ep = 1 and for blocks without experts),
    less the all-to-all the paired forwards and backwards hide under moe_a2a_overlap (`_hide`)."""
    ep = getattr(cfg, "ep", 1)
    facts = moe_facts(ctx).get(unit.name) if ep > 1 and unit.kind == "block" else None
    key = (unit.name, cfg.dp, cfg.tp, ep, cfg.mbs, cfg.zero, getattr(cfg, "etp", 0)) + overlap_key(ctx, cfg)
    cache = ctx.__dict__.setdefault("_ep_delta", {})
    if key not in cache:
        d = ep_unit_delta(facts, dp=cfg.dp, tp=cfg.tp, ep=ep, mbs=cfg.mbs, zero=cfg.zero,
                          cluster=ctx.cluster, settings=ctx.settings, stage_devices=cfg.dp * cfg.tp,
                          etp=getattr(cfg, "etp", 0))
        cache[key] = _hide(ctx, unit, cfg, d) if facts and overlap_key(ctx, cfg) else d
    return cache[key]


def overlap_on(ctx, cfg) -> bool:
    """moe_a2a_overlap asked for and Megatron-Core runs it at cfg (pipeline/overlap.overlap_problem)."""
    st = ctx.settings
    return bool(st.moe_a2a_overlap) and overlap_problem(pp=cfg.pp, schedule=cfg.schedule, v=cfg.v, ep=cfg.ep,
                                                        full_recompute=False, mixed=st.mixed) is None


def overlap_key(ctx, cfg) -> tuple:
    """What the hidden all-to-all depends on beyond the unit numbers' own key: the schedule's pairs."""
    return (cfg.pp, cfg.m, cfg.schedule, cfg.v, ctx.settings.delay_wgrad) if overlap_on(ctx, cfg) else ()


def _hide(ctx, unit, cfg, d) -> dict:
    """`d` less the all-to-all hidden under moe_a2a_overlap: a paired_fraction of the micro-batches run
    their forward beside another's backward (pipeline/overlap.py); each pair hides paired_hidden of
    the all-to-alls, the partner's compute being this block's own (a chunk's blocks alike, as Megatron
    pairs forward layer i with backward layer n-1-i); the unpaired (warm-up, cool-down) pay in full."""
    a_f, a_b = d["a2a_s"]
    f, b = unit.fb_at(cfg.mbs, cfg.zero)
    fc, bc = f + d["fwd_s"] - a_f, b + d["bwd_s"] - a_b      # compute of this block's forward, backward
    hf, hb = paired_hidden(a_f, a_b, fc, bc, d["dw_s"] if ctx.settings.delay_wgrad else 0.0)
    frac = paired_fraction(cfg.schedule if cfg.pp > 1 else "none", cfg.pp, cfg.m, cfg.v)
    return dict(d, fwd_s=d["fwd_s"] - frac * hf, bwd_s=d["bwd_s"] - frac * hb, hidden_s=(frac * hf, frac * hb))


def ep_note(ctx, cfg) -> str:
    """The plan's note on expert parallelism (under a pipeline: the groups are each stage's own, as
    sapp/emit/ep/experts.py runs them)."""
    facts = moe_facts(ctx)
    E = min(f["experts"] for f in facts.values())
    s = (f"expert parallelism ep={cfg.ep}: {E // cfg.ep} of {E} experts per rank, all-to-all dispatch/combine "
         f"over {cfg.ep} ranks, expert gradients synced over {cfg.dp // cfg.ep} expert-DP ranks")
    if cfg.tp > 1 and getattr(cfg, "etp", 0) == 1:
        s = (f"expert parallelism ep={cfg.ep} x tp={cfg.tp}: {E // (cfg.ep * cfg.tp)} of {E} experts whole per rank "
             f"(Megatron's --expert-tensor-parallel-size 1, --expert-model-parallel-size {cfg.ep * cfg.tp}), all-to-all "
             f"dispatch/combine over {cfg.ep * cfg.tp} ranks, expert gradients synced over {cfg.dp // cfg.ep} expert-DP "
             f"ranks; priced only: sapp run emits ep at tp 1")
    elif cfg.tp > 1:
        s += (f"; each expert split over the {cfg.tp} tensor-parallel ranks (Megatron's expert-tp = tp; "
              f"priced only: sapp run emits ep at tp 1)")
    if cfg.pp > 1:
        s += " of each pipeline stage (the all-to-all stays inside the stage)"
    if overlap_on(ctx, cfg):
        frac = paired_fraction(cfg.schedule if cfg.pp > 1 else "none", cfg.pp, cfg.m, cfg.v)
        s += (f"; Megatron's --overlap-moe-expert-parallel-comm{' --delay-wgrad-compute' if ctx.settings.delay_wgrad else ''}"
              f": {frac:.0%} of the micro-batches' forwards run beside another's backward (the schedule's order, "
              f"pipeline/overlap.py), each one's all-to-alls hidden behind the other's compute; the rest exposed "
              f"(priced only: sapp run runs every all-to-all exposed)")
    return s


def check_overlap_pins(cons, settings) -> None:
    """ConstraintError, in one line, where overlap_pins_problem finds one."""
    why = overlap_pins_problem(cons, settings)
    if why:
        raise ConstraintError(why)


def overlap_pins_problem(cons, settings):
    """One line when moe_a2a_overlap is asked beside pins Megatron-Core refuses it with (its
    TransformerConfig rules, pipeline/overlap.overlap_problem), else None.  Unpinned, the search
    keeps to the configurations it runs at (ep_configs, context.allowed)."""
    if not settings.moe_a2a_overlap:
        return None
    rc = cons.recompute
    full = rc == "full" or (isinstance(rc, dict) and "full" in rc.values())
    # (what is not pinned the search chooses among what runs it: interleaved, ep > 1)
    return overlap_problem(pp=cons.pp or 1, schedule=cons.schedule or "interleaved", v=cons.virtual_chunks or 2,
                           ep=cons.ep or 2, full_recompute=full, mixed=settings.mixed)
