"""torch's nn.MultiheadAttention split by heads, found on the operator graph.

nn.MultiheadAttention applies its packed `in_proj_weight` [3E, E] and `out_proj.weight` [E, E] in its
own forward (F.multi_head_attention_forward): both matmuls belong to the attention module itself, not
to a Linear DTensor's styles could split, and between them its heads are folded into the batch
(`view(L, N * H, E / H)`), which the op-by-op layout of tp_layout does not carry.  The emitter
instead runs the module with a forward of its own over a rank's heads (sapp/emit/tp/mha.py): the q, k
and v pieces of in_proj each split over tp (the rows of head h to rank h * tp // H), out_proj by its
input columns, one all-reduce at the output, the same as Megatron's attention.  So the region is
recognised from the graph as that module's: in module M, a matmul whose weight is `M.in_proj_weight`
with 3E rows, an SDPA over H heads, a matmul whose weight is `M.out_proj.weight`; H divides by tp.

The plan names it `tp_modules[M] = "heads"`.  For pricing, the in-projection is split on its out
features (n), the attention on its heads, the out-projection on its contraction (k); the views
between them are priced whole.  Pure Python over the OpGraph."""
from __future__ import annotations


def _weight(node, suffix: str):
    for op in node.operands:
        if op.param is not None and op.param == f"{node.module}.{suffix}" and tuple(op.dims) == ("n", "k"):
            return op
    return None


def holders(graph) -> dict:
    """{matmul node: ("in" | "out", module)} of every nn.MultiheadAttention-shaped projection."""
    out = {}
    for n, node in graph.nodes.items():
        if node.kind != "matmul" or not node.module:
            continue
        if _weight(node, "in_proj_weight") is not None:
            out[n] = ("in", node.module)
        elif _weight(node, "out_proj.weight") is not None:
            out[n] = ("out", node.module)
    return out


def regions(graph, tp: int, region_cls) -> list:
    """One `region_cls` (tp_layout.Region) per nn.MultiheadAttention module of the graph, `why`
    saying why it cannot be split by heads ('' when it can)."""
    by_mod = {}
    for n, (role, mod) in holders(graph).items():
        by_mod.setdefault(mod, {"in": [], "out": []})[role].append(n)
    out = []
    for mod, ends in by_mod.items():
        inside = [n for n, node in graph.nodes.items() if node.module == mod]
        attn = [n for n in inside if graph.nodes[n].kind == "attention"]
        r = region_cls(ends["in"], ends["out"], members=set(inside) - set(ends["in"]) - set(ends["out"]))
        r.why = _why(graph, mod, ends, attn, tp)
        if not r.why:
            heads = graph.nodes[attn[0]].dims[1].name
            r.dims = {ends["in"][0]: "n", attn[0]: heads, ends["out"][0]: "k"}
        out.append(r)
    return out


def _why(graph, mod: str, ends: dict, attn: list, tp: int) -> str:
    if not ends["in"] and any(op.param == f"{mod}.q_proj_weight" for node in graph.nodes.values()
                              if node.module == mod for op in node.operands):
        return f"{mod} has separate q/k/v projection weights (nn.MultiheadAttention with kdim / vdim != embed_dim)"
    if not ends["in"]:
        return (f"{mod} applies slices of its in_proj_weight (nn.MultiheadAttention attending over another "
                f"input: q from one, k and v from another)")
    if len(ends["in"]) != 1 or len(ends["out"]) != 1:
        return f"{mod} applies its in_proj_weight {len(ends['in'])} times (nn.MultiheadAttention called more than once)"
    if len(attn) != 1 or len(graph.nodes[attn[0]].out.shape) != 4:
        return (f"{mod} computes its attention weights itself (nn.MultiheadAttention with need_weights=True "
                f"averages them over every head)")
    h = graph.nodes[attn[0]].out.shape[1]
    rows = next(d.size for d in graph.nodes[ends["in"][0]].dims if d.name == "n")
    if rows % 3 or (rows // 3) % h:
        return f"{mod}'s in_proj_weight has {rows} rows, not q, k and v of {h} heads"
    if h % tp:
        return f"{mod} has {h} heads, which tp={tp} does not divide"
    return ""
