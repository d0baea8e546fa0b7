"""Key/value heads repeated to the query heads as the inner factor, split by heads (grouped-query attention).

x-transformers repeats a grouped-query attention's key / value heads as `b kvh n d -> b (r kvh) n d`:
query head i reads key head i % kvh.  A rank holding a contiguous block of the key heads then serves
the query heads {r * kvh + its key heads, for every r}: not a contiguous block of the query heads, so
a plain column split of q would pair a rank's queries with another rank's keys.  The capture maps a
merge of axes to its outermost one, so the key-head axis vanishes at that reshape (`regroup` finds it).

Split by heads all the same, as litgpt's and HF's `repeat_kv` (key heads outer) already are: the
merged axis carries the key-head split in `P` equal pieces (P = the repeat), each cut between the
ranks, which is exactly the row order of a fused projection cut into P equal pieces
(sapp/emit/tp/fused.py).  So the projection that makes the query heads gets its rows in that order,
the closer (`to_out`, reading the merged heads) its input columns, and the key / value projections
split as they are: each rank's repeat of its own key heads then lines up with its queries.  Pure
Python over the OpGraph."""
from __future__ import annotations

import math

_RESHAPES = ("aten.reshape.default", "aten.view.default", "aten._unsafe_view.default")


def regroup(node, op, axis: int):
    """(output op dim, P) where reshape `node` merges its operand's axis `axis` (the split, unmapped
    by the capture) into an output axis as an inner factor, P the product of the axes before it in
    that merge; None when it is not such a merge."""
    if str(node.target) not in _RESHAPES or op.dims[axis] is not None:
        return None
    j = axis - 1
    while j >= 0 and op.dims[j] is None:
        j -= 1
    if j < 0:
        return None
    k = axis
    while k + 1 < len(op.dims) and op.dims[k + 1] is None:
        k += 1
    d = op.dims[j]
    if d not in node.out.dims or math.prod(op.shape[j:k + 1]) != node.out.shape[node.out.dims.index(d)]:
        return None
    if any(x.name == d and x.batch for x in node.dims):
        return None         # heads folded into the data batch ((b h): local-attention's windows): tp_fold.py
    p = math.prod(op.shape[j:axis])
    return (d, p) if p > 1 else None


def into_batch(node, op, axis: int) -> bool:
    """Whether reshape `node` folds its operand's axis `axis` (the split) into the data batch's axis."""
    if str(node.target) not in _RESHAPES or op.dims[axis] is not None:
        return False
    j = axis - 1
    while j >= 0 and op.dims[j] is None:
        j -= 1
    return j >= 0 and any(x.name == op.dims[j] and x.batch for x in node.dims)


def regroups(graph, dims: dict) -> dict:
    """{reshape node: P} of the merges `regroup` finds on a layout ({node: op dim on the tp level})."""
    out = {}
    for name, d in dims.items():
        node = graph.nodes[name]
        for op, axis in _split_operands(graph, node, dims):
            rg = regroup(node, op, axis) if axis < len(op.dims) else None
            if rg is not None and rg[0] == d:
                out[name] = rg[1]
    return out


def regroup_parts(graph, dims: dict, linears: set, tp: int = None, folds: dict = None) -> tuple:
    """({linear node: piece sizes}, why) for the layout `dims`: in each split component (ops the
    split flows through) with a regroup, the column-split linears whose output does not pass through
    one (the query projection) get P equal pieces of their rows, the row-split linears the merged
    axis reaches (the closer) P equal pieces of their input columns.  `tp`: each piece must divide.
    A component whose heads ride a batch they are folded into (`folds`, tp_fold.py: (outer, heads,
    inner)) needs no pieces where the heads are the innermost factor of every fold and every repeat:
    local-attention's per-head bias repeated `h i j -> (b h) 1 i j` then holds a rank's rows of that
    batch in the fold's own order."""
    rgs = regroups(graph, dims)
    if not rgs:
        return {}, ""
    consumers = graph.consumers()
    down = _reach(rgs, lambda n: [c for c, _ in consumers[n] if c in dims])
    out = {}
    for comp in _components(graph, dims, consumers):
        ps = {rgs[n] for n in comp if n in rgs}
        if not ps:
            continue
        if len(ps) > 1:
            return {}, f"key heads repeated {sorted(ps)} times in one region"
        p = ps.pop()
        fs = {folds[n] for n in comp if n in (folds or {})}
        # the repeat count is the batch's (b // heads at a rank: its own rows), so only the heads'
        # place matters: innermost in both
        if fs and all(f[2] == 1 for f in fs) and all(_inner(graph, n, dims) == 1 for n in comp if n in rgs):
            continue
        if fs:
            return {}, f"a tensor repeated {p} times meets heads folded into the batch as {sorted(fs)}"
        up = _reach([n for n in comp if n in rgs], lambda n: [o.producer for o in graph.nodes[n].operands
                                                               if o.producer in dims])
        for n in comp:
            if n not in linears:
                continue
            d = dims[n]
            size = next(x.size for x in graph.nodes[n].dims if x.name == d)
            if d == "n" and n not in up:
                out[n] = [size // p] * p
            elif d == "k" and n in down:
                out[n] = [size // p] * p
            else:
                continue
            if size % p or (tp and (size // p) % tp):
                return {}, f"{graph.nodes[n].module} cannot be cut into {p} pieces a rank's heads divide"
    return out, ""


def _inner(graph, name: str, dims: dict) -> int:
    """The product of the axes after the split in the merge regroup node `name` makes."""
    for op, axis in _split_operands(graph, graph.nodes[name], dims):
        k = axis
        while k + 1 < len(op.dims) and op.dims[k + 1] is None:
            k += 1
        return math.prod(op.shape[axis + 1:k + 1])
    return 0


def _split_operands(graph, node, dims: dict):
    """(operand, axis) of each operand of `node` whose producer's output carries its split (`dims`)."""
    for op in node.operands:
        pd = dims.get(op.producer)
        if pd is not None and pd in graph.nodes[op.producer].out.dims:
            yield op, graph.nodes[op.producer].out.dims.index(pd)


def _reach(start, nxt) -> set:
    seen, stack = set(), list(start)
    while stack:
        cur = stack.pop()
        if cur not in seen:
            seen.add(cur)
            stack.extend(nxt(cur))
    return seen


def _components(graph, dims: dict, consumers) -> list:
    """The layout's nodes in groups connected by the split flowing from one to the next."""
    left, out = set(dims), []
    for start in dims:
        if start not in left:
            continue
        comp, stack = set(), [start]
        while stack:
            cur = stack.pop()
            if cur in comp:
                continue
            comp.add(cur)
            left.discard(cur)
            stack.extend(c for c, _ in consumers[cur] if c in dims)
            stack.extend(o.producer for o in graph.nodes[cur].operands if o.producer in dims)
        out.append(comp)
    return out
