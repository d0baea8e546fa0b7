"""Projections whose output the model cuts into pieces along its out features (a fused q/k/v), found
on the operator graph whatever a layout does with them (read by sapp/emit/checks/before.py through
tp_layout).  Pure Python over the OpGraph."""
from __future__ import annotations

from .linears import linears


def fused_openers(graph) -> dict:
    """{linear node: piece sizes} of every projection whose output is cut into pieces along its out
    features, whatever a layout does with it: a hand-written tp_modules that splits one column-wise
    would hand rank 0 all of q and half of k (emit refuses it, sapp/emit/checks/before.py)."""
    lin, out = set(linears(graph)), {}
    for name, node in graph.nodes.items():
        piece = node.extra.get("piece") if node.kind == "view" else None
        if piece is None or not node.operands:
            continue
        op, axis = node.operands[0], piece["axis"]
        while op.producer is not None:
            p = graph.nodes[op.producer]
            d = p.out.dims[axis] if axis < len(p.out.dims) else None
            if op.producer in lin:
                if d == "n":
                    out[op.producer] = list(piece["sizes"])
                break
            nxt = [(o, o.dims.index(d)) for o in p.operands if o.producer and d is not None and d in o.dims]
            if len(nxt) != 1 or nxt[0][0].shape[nxt[0][1]] != p.out.shape[axis]:
                break
            op, axis = nxt[0]
    return out

