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
  shared_experts  the shared experts of an MoE layer (a normal checkpoint).
  (mla_up_proj needs multi-latent attention, which sapp refuses on import.)

Two kinds of checkpoint, priced as they free memory:
  - output-discarding (layernorm, moe_act; and sapp's attention core): the module's outputs are
    dropped wherever they are saved (the next linear's input), its inputs kept; its forward is rerun;
  - normal (mlp, moe, shared_experts): the module keeps its input; what its own operators save of
    tensors made inside it is dropped; the output it hands on is saved by its consumers as before.
The recomputation is each region's forward seconds.  Not priced: an MoE layer's all-to-alls rerun
under expert parallelism by `moe` (the profile's forward holds no all-to-all; costmodel/moe.py adds it)."""
from __future__ import annotations

MEGATRON_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts")
DISCARDING = ("core_attn", "layernorm", "moe_act")


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


def module_regions(graph, names, attention_core) -> dict:
    """{Megatron module: the block's operators it recomputes} for the modules this block has (a dense
    block: core_attn, mlp; an MoE block: core_attn, layernorm, moe, moe_act, shared_experts when it
    has them).  `attention_core(graph, names)`: sapp's attention core (pipeline/profile.py)."""
    out = {}
    core = attention_core(graph, names)
    if core:
        out["core_attn"] = set(core)
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
    for more than the attention core: a dense model's MLP; an MoE model's expert activation and
    pre-MLP norm (output-discarding, cheap), or its whole MoE layer.  Each with core_attn (no change
    under a fused attention kernel)."""
    have = set()
    for names in (graph.blocks or {}).values():
        have |= set(module_regions(graph, names, attention_core))
    if "moe" in have:
        return [tuple(sorted({"core_attn", "moe_act", "layernorm"} & (have | {"core_attn"}))), ("core_attn", "moe")]
    return [("core_attn", "mlp")] if "mlp" in have else []
