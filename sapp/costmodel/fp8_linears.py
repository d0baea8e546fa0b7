"""Which operators run as FP8 linear layers (costmodel/fp8.py prices them), and which of them read the
same input: pure functions over the graph, imported by the width stamp (costmodel.dtypes) without the
pricing."""
from __future__ import annotations


def is_fp8_linear(node) -> bool:
    """A linear layer inside a repeated block: a matmul with a weight."""
    return node.kind == "matmul" and node.block is not None and any(
        o.param is not None and len(o.shape) == 2 for o in node.operands)


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
