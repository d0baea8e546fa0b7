"""Which operators run as FP8 linear layers (costmodel/fp8.py prices them), and which of them read the
same input: pure functions over the graph, imported by the width stamp (costmodel.dtypes) without the
pricing.

The experts' grouped GEMMs run in FP8 where the engine of the recipe converts them: Transformer Engine's
recipes ("delayed", "blockwise": Megatron-Core's TEGroupedMLP builds its experts from TE's GroupedLinear
and runs them inside the same fp8 autocast, core_v0.16.1 moe/experts.py, `Fp8Padding` of the routed rows
when config.fp8); torchao's tensorwise Float8Linear swaps nn.Linear only (torchtitan 0.2.2's MoE experts
need the separate "quantize.grouped_mm.float8" converter, rowwise scales, which sapp refuses): bf16."""
from __future__ import annotations


def is_fp8_linear(node) -> bool:
    """A linear layer inside a repeated block: a matmul with a weight."""
    return node.kind == "matmul" and node.block is not None and any(
        o.param is not None and len(o.shape) == 2 for o in node.operands)


# the recipes whose engine runs the experts' grouped GEMMs in FP8 (above)
GROUPED_FP8_RECIPES = ("delayed", "blockwise")


def is_fp8_grouped(node) -> bool:
    """An experts' grouped GEMM inside a repeated block (capture's grouped_mm: a [E, k, n] weight)."""
    return node.kind == "matmul" and node.block is not None and bool(node.extra.get("experts")) and any(
        o.param is not None and len(o.shape) == 3 for o in node.operands)


def is_fp8_gemm(node, recipe: str) -> bool:
    """`node` runs in FP8 under `recipe`: a block's linear, or an expert grouped GEMM where the engine
    converts those (GROUPED_FP8_RECIPES)."""
    if not recipe:
        return False
    return is_fp8_linear(node) or (recipe in GROUPED_FP8_RECIPES and is_fp8_grouped(node))


def fp8_shares(graph) -> dict:
    """name -> how many FP8 linears read the same activation as this one (1 for one alone): the
    casts a compiled graph computes once (costmodel/fp8.py)."""
    readers = {}
    for n in graph.nodes.values():
        if is_fp8_linear(n):
            for o in n.operands:
                if o.param is None and o.producer is not None:
                    readers.setdefault(o.producer, []).append(n.name)
    out = {}
    for names in readers.values():
        for name in names:
            out[name] = len(names)
    return out
