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

from ...costmodel.moe import ep_unit_delta


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
    """What ep changes in `unit`'s numbers under cfg (zeros for ep = 1 and for blocks without experts)."""
    ep = getattr(cfg, "ep", 1)
    facts = moe_facts(ctx).get(unit.name) if ep > 1 and unit.kind == "block" else None
    key = (unit.name, cfg.dp, cfg.tp, ep, cfg.mbs, cfg.zero, getattr(cfg, "etp", 0))
    cache = ctx.__dict__.setdefault("_ep_delta", {})
    if key not in cache:
        cache[key] = ep_unit_delta(facts, dp=cfg.dp, tp=cfg.tp, ep=ep, mbs=cfg.mbs, zero=cfg.zero,
                                   cluster=ctx.cluster, settings=ctx.settings, stage_devices=cfg.dp * cfg.tp,
                                   etp=getattr(cfg, "etp", 0))
    return cache[key]


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
    return s
