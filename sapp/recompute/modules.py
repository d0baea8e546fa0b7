"""Megatron-Core's selective recomputation of named modules (`--recompute-granularity selective
--recompute-modules ...`), priced on a block's captured operators: pure functions of the graph.

Megatron-Core core_v0.16.1 (TransformerConfig.recompute_modules; TransformerLayer, MLP, MoELayer)
recomputes, per module named:
  core_attn       the attention core (sapp's default selective policy: pipeline/profile.attention_core);
  layernorm       input_layernorm and pre_mlp_layernorm with output-discarding checkpoints.  Under
                  Transformer Engine's layer spec (the one sapp prices) the input norm, and a dense
                  layer's pre-MLP norm, are fused into the next linear (IdentityOp in the layer):
                  only an MoE layer's pre-MLP norm is a module of its own, and only it is recomputed;
  mlp             a dense layer's MLP, the fused pre-MLP norm included (a normal checkpoint; nothing
                  on MoE layers);
  moe             the whole MoE layer: router, dispatch, experts, shared experts (a normal checkpoint);
  moe_act         the experts' activation between their two grouped GEMMs (output-discarding; Megatron
                  needs --moe-grouped-gemm);
  shared_experts  the shared experts of an MoE layer (a normal checkpoint);
  mla_up_proj     multi-latent attention's up-projections and the rotary embedding after them, up to
                  the attention's queries, keys and values (output-discarding: MLASelfAttention's
                  qkv_up_checkpoint keeps the compressed q, kv and the rope key; `mla_up_region`).

Two kinds of checkpoint, priced as they free memory:
  - output-discarding (layernorm, moe_act, mla_up_proj; and sapp's attention core): the module's outputs are
    dropped wherever they are saved (the next linear's input), its inputs kept; its forward is rerun;
  - normal (mlp, moe, shared_experts): the module keeps its input; what its own operators save of
    tensors made inside it is dropped; the output it hands on is saved by its consumers as before.
The recomputation is each region's forward seconds.  Not priced: an MoE layer's all-to-alls rerun
under expert parallelism by `moe` (the profile's forward holds no all-to-all; costmodel/moe.py adds it)."""
from __future__ import annotations

MEGATRON_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts")
DISCARDING = ("core_attn", "layernorm", "mla_up_proj", "moe_act")


def _inside(node, module) -> bool:
    return bool(module) and (node.module == module or node.module.startswith(module + "."))


def _param_mm(node) -> bool:
    return node.kind == "matmul" and bool(node.params)


def moe_module(graph, names) -> str:
    """The module of the block's MoE layer (its grouped expert GEMMs), or ""."""
    for n in names:
        node = graph.nodes[n]
        if node.extra.get("experts"):
            return node.module
    return ""


def _norm_before(graph, names, first) -> list:
    """The norm right before position `first` and the views of its output up to there (what its
    consumers save is a view's tensor), or []."""
    i = first - 1
    while i >= 0 and graph.nodes[names[i]].kind == "view":
        i -= 1
    if i < 0 or graph.nodes[names[i]].kind != "norm":
        return []
    j = i + 1
    while j < len(names) and graph.nodes[names[j]].kind == "view":
        j += 1
    return names[i:j]


def _region(graph, names, module) -> list:
    return [n for n in names if _inside(graph.nodes[n], module)]


def _through_views(graph, n):
    """The first producer at or before `n` that is not a view (None past the graph's inputs)."""
    while n is not None and graph.nodes[n].kind == "view":
        n = graph.nodes[n].operands[0].producer if graph.nodes[n].operands else None
    return n


def _up_projection(graph, n) -> bool:
    """Whether linear `n` reads a norm of another linear's output (MLA's q_b, kv_b: x W_d, RMSNorm, W_u)."""
    node = graph.nodes[n]
    if not _param_mm(node) or not node.operands:
        return False
    norm = _through_views(graph, node.operands[0].producer)
    if norm is None or graph.nodes[norm].kind != "norm" or not graph.nodes[norm].operands:
        return False
    down = _through_views(graph, graph.nodes[norm].operands[0].producer)
    return down is not None and _param_mm(graph.nodes[down])


def mla_up_region(graph, names) -> set:
    """The operators of a block's multi-latent attention Megatron's mla_up_proj recomputes: walking
    back from the attention's inputs to the first linears, the up-projections (`_up_projection`) and
    everything between them and the attention (views, splits, the rotary embedding of q and of the
    shared rope key), less views of tensors made outside it and what also feeds operators outside it
    (kept as the checkpoint's inputs).  Empty where the block's attention reads no up-projection."""
    inside = set(names)
    attn = [n for n in names if graph.nodes[n].kind == "attention"]
    region, ups, todo = set(), set(), [p for a in attn for p in graph.nodes[a].producers]
    while todo:
        n = todo.pop()
        if n in region or n not in inside:
            continue
        if _param_mm(graph.nodes[n]):
            if _up_projection(graph, n):
                region.add(n)
                ups.add(n)
            continue
        region.add(n)
        todo.extend(graph.nodes[n].producers)
    if not ups:
        return set()
    # views of a tensor made outside (the rope key's slice of the kv down-projection, the rotary
    # tables) are that tensor, kept as the checkpoint's input
    region -= {n for n in region if graph.nodes[n].kind == "view" and _through_views(graph, n) not in region}
    consumers = graph.consumers()
    keep = region | set(attn)
    changed = True
    while changed:
        out = {n for n in region if any(c not in keep for c, _ in consumers[n])}
        changed = bool(out)
        region -= out
        keep -= out
    return region


def module_regions(graph, names, attention_core) -> dict:
    """{Megatron module: the block's operators it recomputes} for the modules this block has (a dense
    block: core_attn, mlp; an MoE block: core_attn, layernorm, moe, moe_act, shared_experts when it
    has them).  `attention_core(graph, names)`: sapp's attention core (pipeline/profile.py)."""
    out = {}
    core = attention_core(graph, names)
    if core:
        out["core_attn"] = set(core)
    up = mla_up_region(graph, names)
    if up:
        out["mla_up_proj"] = up
    moe = moe_module(graph, names)
    if moe:
        region = _region(graph, names, moe)
        out["moe"] = set(region)
        norm = _norm_before(graph, names, names.index(region[0]))
        if norm:
            out["layernorm"] = set(norm)
        gemms = [i for i, n in enumerate(names) if graph.nodes[n].extra.get("experts")]
        if len(gemms) >= 2:
            act = {names[i] for i in range(gemms[0] + 1, gemms[1]) if graph.nodes[names[i]].kind == "elementwise"}
            if act:
                out["moe_act"] = act
        # the shared experts: a submodule of the MoE layer holding linears that are not its router
        # (the MoE layer's first linear) and not the experts
        mms = [n for n in region if _param_mm(graph.nodes[n]) and graph.nodes[n].module != moe]
        subs = []
        for n in mms[1:]:
            rest = graph.nodes[n].module[len(moe) + 1:].split(".")[0]
            sub = f"{moe}.{rest}"
            if sub not in subs and sub != graph.nodes[mms[0]].module:
                subs.append(sub)
        shared = {n for s in subs for n in _region(graph, names, s)}
        if shared:
            out["shared_experts"] = shared
        return out
    mms = [n for n in names if _param_mm(graph.nodes[n])]
    if mms:
        parent = graph.nodes[mms[-1]].module.rsplit(".", 1)[0]
        region = [n for n in _region(graph, names, parent) if graph.nodes[n].kind != "dropout"]
        if region and parent != graph.nodes[mms[-1]].block:
            out["mlp"] = set(region) | set(_norm_before(graph, names, names.index(region[0])))
    return out


def selective_sets(graph, names, modules, attention_core) -> tuple:
    """(discarded, checkpointed, rerun) for `modules` on one block: the operators whose outputs are
    dropped wherever saved (output-discarding), those whose outputs are dropped where an operator of
    the same region saves them (normal checkpoints, as a list of regions), and every operator rerun."""
    regions = module_regions(graph, names, attention_core)
    discarded, checkpointed, rerun = set(), [], set()
    for m in modules:
        r = regions.get(m)
        if not r:
            continue
        rerun |= r
        if m in DISCARDING:
            discarded |= r
        else:
            checkpointed.append(r)
    return discarded, checkpointed, rerun


def dropped(prod, saver, discarded, checkpointed) -> bool:
    """Whether selective recomputation drops a tensor made by `prod` and saved by `saver`."""
    if prod is None:
        return False
    return prod in discarded or any(prod in r and saver in r for r in checkpointed)


def missing_modules(graph, blocks, modules, attention_core) -> list:
    """The modules of `modules` no block of the model has (e.g. moe on a dense model).  core_attn is
    never missing: under a fused attention kernel it has nothing to drop (Megatron-Core warns as much)
    and is priced as no change."""
    have = {"core_attn"}
    for names in blocks:
        have |= set(module_regions(graph, names, attention_core))
    return [m for m in modules if m not in have]


def expert_kept(modules, facts) -> float:
    """The share of the experts' ffn-width stash (up/gate outputs, the down GEMM's input) selective
    recomputation keeps: none under moe (the layer is checkpointed whole), all but the activation's
    output under moe_act (`facts["act_out_share"]`, search/joint/ep.moe_facts), all otherwise."""
    if "moe" in modules:
        return 0.0
    if "moe_act" in modules and facts:
        return 1.0 - facts.get("act_out_share", 0.0)
    return 1.0


def search_candidates(graph, attention_core) -> list:
    """The module sets a --target megatron search weighs as selective recomputation where memory asks
    for more than the attention core: a dense model's MLA up-projections or its MLP; an MoE model's
    expert activation, pre-MLP norm and MLA up-projections (output-discarding, cheap), or its whole
    MoE layer.  Each with core_attn (no change
    under a fused attention kernel)."""
    have = set()
    for names in (graph.blocks or {}).values():
        have |= set(module_regions(graph, names, attention_core))
    cheap = {"core_attn", "mla_up_proj", "moe_act", "layernorm"} & (have | {"core_attn"})
    if "moe" in have:
        return [tuple(sorted(cheap)), ("core_attn", "moe")]
    mla = [("core_attn", "mla_up_proj")] if "mla_up_proj" in have else []
    return mla + ([("core_attn", "mlp")] if "mlp" in have else [])
