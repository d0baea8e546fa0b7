"""Recognise an RMSNorm written out in element-wise ops and make it one `norm` node.

HF models (Llama, Mistral, Qwen2, Mixtral, T5...) write RMSNorm by hand:
    x32 = x.to(float32); r = rsqrt(mean(x32 ** 2, -1, keepdim) + eps); y = w * (x32 * r).to(dtype)
which captures as pow -> mean -> add -> rsqrt -> mul [-> cast] [-> mul by weight].  Left as is, the
search could split the normalised axis like any element-wise axis (a norm needs the whole row) and
the cost model would count six ops' traffic and saved tensors.  As one node it is what it computes:
a norm over the last axis (kept whole), 4 FLOPs per element (square, sum, scale, weight), saving its
input - priced like aten.rms_norm, whose name it takes.  The fused node keeps the name of the last
op it absorbs, so every consumer's operand still points at it."""
from __future__ import annotations

from sapp.capture.ir import Dim, OpNode, Operand

_CASTS = ("to", "_to_copy", "type_as")


def _op(node) -> str:
    parts = node.target.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "aten" else parts[0]


def _consumers(nodes):
    out = {}
    for n in nodes.values():
        for o in n.operands:
            if o.producer is not None:
                out.setdefault(o.producer, []).append(n.name)
    return out


def fuse_rms_norms(nodes: dict, outputs=()) -> dict:
    """nodes (name -> OpNode, in graph order) with every hand-written RMSNorm fused; others as given."""
    users = _consumers(nodes)
    keep = set(outputs)

    def only_user(name):
        u = users.get(name, [])
        return u[0] if len(u) == 1 and name not in keep else None

    removed, fused = set(), {}
    for m in nodes.values():
        if _op(m) != "mul" or len(m.operands) != 2 or m.name in removed:
            continue
        chain = _match(nodes, m, only_user)
        if chain is None:
            continue
        x_op, absorbed = chain
        last, weight = m, None
        nxt = only_user(m.name)
        if nxt is not None and _op(nodes[nxt]) in _CASTS and nodes[nxt].kind == "view":
            cast = nodes[nxt]
            w = only_user(cast.name)
            if w is not None and _weight_mul(nodes[w], cast.name):
                absorbed.append(cast.name)
                last, weight = nodes[w], _weight_mul(nodes[w], cast.name)
        elif nxt is not None and _weight_mul(nodes[nxt], m.name):
            last, weight = nodes[nxt], _weight_mul(nodes[nxt], m.name)
        if last is not m:
            absorbed.append(m.name)
        removed.update(absorbed)
        fused[last.name] = _norm_node(last, m, x_op, weight, absorbed)
    if not fused:
        return nodes
    return {k: fused.get(k, v) for k, v in nodes.items() if k not in removed}


def _match(nodes, m, only_user):
    """(operand x of the final scale, names of pow/mean/add/rsqrt) when m = x * rsqrt(mean(x²)+eps)."""
    for i in (0, 1):
        r, x = m.operands[1 - i], m.operands[i]
        if r.producer is None or x.producer is None or r.producer not in nodes:
            continue
        rs = nodes[r.producer]
        if _op(rs) != "rsqrt" or only_user(rs.name) != m.name:
            continue
        add = _producer(nodes, rs, 0)
        if add is None or _op(add) != "add" or only_user(add.name) != rs.name:
            continue
        mean = next((nodes[o.producer] for o in add.operands if o.producer in nodes
                     and _op(nodes[o.producer]) == "mean"), None)
        if mean is None or only_user(mean.name) != add.name or not _last_axis_keepdim(mean):
            continue
        sq = _producer(nodes, mean, 0)
        if sq is None or only_user(sq.name) != mean.name or not _squares(sq, x.producer):
            continue
        return x, [sq.name, mean.name, add.name, rs.name]
    return None


def _producer(nodes, n, i):
    if i >= len(n.operands) or n.operands[i].producer not in nodes:
        return None
    return nodes[n.operands[i].producer]


def _last_axis_keepdim(mean) -> bool:
    ish, osh = mean.operands[0].shape, mean.out.shape
    return len(ish) == len(osh) and osh[:-1] == ish[:-1] and osh[-1] == 1 and ish[-1] > 1


def _squares(sq, x_name) -> bool:
    """pow(x, 2) (the exponent is not kept: a pow of x feeding a last-axis mean that then scales
    x is a square in every norm written this way) or mul(x, x)."""
    prods = [o.producer for o in sq.operands if o.producer is not None]
    if _op(sq) == "pow":
        return prods == [x_name]
    return _op(sq) == "mul" and prods == [x_name, x_name]


def _weight_mul(n, src):
    """The weight operand when n = weight * src (weight a parameter over the last axis)."""
    if _op(n) != "mul" or len(n.operands) != 2:
        return None
    a, b = n.operands
    w, y = (a, b) if a.param is not None else (b, a)
    if w.param is None or y.producer != src or len(w.shape) != 1:
        return None
    return w


def _norm_node(last, m, x_op, weight, absorbed):
    n = len(m.out.shape)
    dims = tuple(Dim(d.name, d.size, d.splittable and i != n - 1, d.batch) for i, d in enumerate(m.dims))
    names = tuple(d.name for d in dims)
    ops = [Operand(x_op.shape, x_op.dtype, names, x_op.producer, None)]
    if weight is not None:
        ops.append(Operand(weight.shape, weight.dtype, (names[-1],), None, weight.param))
    numel = 1
    for s in m.out.shape:
        numel *= s
    nbytes = float(sum(o.nbytes for o in ops) + last.out.nbytes)
    extra = dict(last.extra)
    # how many captured ops the node stands for (a count, not names: blocks compare their extras)
    extra["fused_ops"] = len(set(absorbed) | {last.name})
    return OpNode(last.name, "norm", "aten.rms_norm.default", dims, tuple(ops), last.out, 4.0 * numel, nbytes,
                  ("in0",), last.module or m.module, last.block, extra)
