"""Per-head tensors made outside a tensor-parallel region, sliced to a rank's heads where they meet it.

ALiBi's slopes times distances and a T5-style relative-position module (x-transformers' `rel_pos`,
shared by every layer) give a bias [h, i, j] for every head; a region split by heads adds it to this
rank's scores [b, h/tp, i, j].  Such an operand is not split by any layer: the emitter slices it to
the rank's heads at that op (sapp/emit/tp/local_shapes.py), and since a rank's slice sends gradient
to this rank's heads only, the parameters it is made from are summed over the tp group after
backward (sapp/emit/checks/shape_audit.py `partial_params`, parallel.TPPartialGrads).  Pure Python
over the OpGraph."""
from __future__ import annotations

_SLICED_OPS = ("aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor")


def sliceable(graph, node, op, d: str, inside: set) -> str:
    """'' when the operand `op` of `node`, made outside the region and running over the split dim `d`
    whole, can be sliced to a rank's part where it meets the split (a per-head bias [h, i, j] that ALiBi
    or a T5-style relative-position module computes for every head, a per-head scale): an add / mul
    of the split by it, every op it comes from made of parameters and constants only (so a rank's
    slice sends gradient to parameters alone, which the emitter sums over the tp group:
    shape_audit.partial_params), at its full length on `d`.  Else why not."""
    axis = op.dims.index(d)
    if broadcast(graph, op, axis):
        # the same values on every head (FAVOR+'s projection repeated over b and h): any op may read
        # it; a model that repeats it to a rank's head count needs nothing, one repeating it to the
        # global count is caught by the shape audit
        return "made from the model's activations" if upstream_inputs(graph, op.producer, inside) else ""
    if str(node.target) not in _SLICED_OPS:
        return f"{node.target or node.kind} is not an add or a product"
    if op.shape[axis] != next(x.size for x in node.dims if x.name == d):
        return "broadcast over it"
    if op.producer is not None and upstream_inputs(graph, op.producer, inside):
        return "made from the model's activations"
    return ""


def broadcast(graph, op, axis: int) -> bool:
    """Whether operand `op` is an expand whose axis `axis` is a broadcast (a new or size-1 axis)."""
    p = graph.nodes[op.producer] if op.producer is not None else None
    if p is None or str(p.target) != "aten.expand.default" or not p.operands:
        return False
    src = p.operands[0]
    d = p.out.dims[axis] if axis < len(p.out.dims) else None
    return d is not None and d not in src.dims


def upstream_inputs(graph, start: str, inside=frozenset()) -> bool:
    """Whether `start` is computed from a model input or an op of `inside` (else from parameters,
    buffers and constants alone)."""
    seen, stack = set(), [start]
    while stack:
        cur = stack.pop()
        if cur in seen:
            continue
        seen.add(cur)
        n = graph.nodes[cur]
        if cur in inside or n.kind == "input":
            return True
        stack.extend(o.producer for o in n.operands if o.producer is not None)
    return False
