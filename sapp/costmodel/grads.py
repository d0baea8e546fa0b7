"""Which ops' outputs carry a gradient, as autograd decides it: a float tensor computed, through any
chain of ops, from a trainable parameter.  Everything else (masks and positions built from the input
ids, rotary cos/sin from a buffer, integer routing indices) has no backward node at all: no backward
kernel, no gradient resharding on its edges and nothing saved for backward.  Pricing those as if they
had one made a Llama-like model's rotary tables all-reduce their (never computed) gradients over the
data-parallel group in every layer.

Stamped once on the whole graph (`stamp`, called by dtypes.ensure_widths) into each node's `extra`:
(output carries a gradient, per operand: that operand carries one).  Sub-graphs copy the stamps of
the graph they were cut from; a node never stamped counts as carrying one (the old, conservative
pricing).  Pure Python: no torch."""
from __future__ import annotations

GRAD_KEY = "grad"
_FLOAT = ("float64", "float32", "float16", "bfloat16")
# bilinear ops: operand i is saved only for the gradients of the *other* operands (d(a*b)/da = b)
_BILINEAR_KINDS = ("matmul",)         # contractions: the factors are the operands over k
_BILINEAR_TARGETS = ("mul",)           # element-wise products


def _op(target: str) -> str:
    parts = target.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "aten" else parts[0]


def stamp(graph) -> None:
    """Stamp every node not yet stamped, in topological order."""
    params = graph.params
    flags = {}
    for name, node in graph.nodes.items():
        st = node.extra.get(GRAD_KEY)
        if st is None or len(st[1]) != len(node.operands):
            ops = []
            for o in node.operands:
                if o.param is not None:
                    info = params.get(o.param)
                    ops.append(info is None or bool(info.trainable))
                elif o.producer is not None:
                    ops.append(flags.get(o.producer, True))
                else:                       # a constant or a graph input: never differentiated
                    ops.append(False)
            out = node.kind != "input" and node.out.dtype in _FLOAT and any(ops)
            st = node.extra[GRAD_KEY] = (out, tuple(ops))
        flags[name] = st[0]


def carries_grad(node) -> bool:
    """Whether autograd computes a gradient for the node's output (True when never stamped)."""
    st = node.extra.get(GRAD_KEY)
    return True if st is None else st[0]


def operand_grads(node) -> tuple:
    """Per operand, whether it carries a gradient (all True when never stamped)."""
    st = node.extra.get(GRAD_KEY)
    return (True,) * len(node.operands) if st is None or len(st[1]) != len(node.operands) else st[1]


def saved_for_backward(node, i: int) -> bool:
    """Whether the node keeps operand i for its backward: never when no gradient flows through it;
    for a product, only when another operand needs its gradient (autograd's MulBackward / MmBackward
    save `other` for `self`'s gradient and the reverse)."""
    if not carries_grad(node):
        return False
    g = operand_grads(node)
    if node.kind in _BILINEAR_KINDS:
        # the factors of the contraction run over k; a bias operand (no k) needs no factor saved
        factors = [j for j, o in enumerate(node.operands) if "k" in o.dims]
        if i in factors:
            return any(g[j] for j in factors if j != i)
    elif node.kind == "elementwise" and _op(node.target) in _BILINEAR_TARGETS:
        return any(g[j] for j in range(len(g)) if j != i)
    return True
