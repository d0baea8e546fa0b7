"""Projections whose output the model cuts into pieces along its out features (a fused q/k/v), found
on the operator graph whatever a layout does with them (read by sapp/emit/checks/before.py through
tp_layout), and the pieces a tp layout splits by heads (`fused_parts`).  Pure Python over the OpGraph."""
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


def piece_cut(node, d):
    """The `piece` facts of a split / chunk piece whose cut axis carries op dim `d`, else None."""
    piece = node.extra.get("piece") if node.kind == "view" else None
    if piece is None or piece["axis"] >= len(node.out.dims) or node.out.dims[piece["axis"]] != d:
        return None
    return piece


def _axis_size(node, d):
    return node.out.shape[node.out.dims.index(d)] if d in node.out.dims else None


def fused_parts(graph, dims: dict, consumers: dict = None) -> tuple:
    """({opener node: piece sizes}, why) for a layout whose ops run over the split axis as `dims`
    says ({node: op dim}): an opener whose output is cut into pieces on that axis (a fused q/k/v
    projection, `chunk(3)` / `split([q, kv, kv])`) is split by heads: each rank's share of the output
    holds its share of every piece, in order (emit permutes the weight's rows to that order).  Between
    the opener and its pieces the fused axis must keep its length (a bias, a dropout, HF Conv1D's
    unflattening view); an op that reads it otherwise (a reshape of it into heads) makes the region
    invalid: the rows it would see are in rank order, not the model's."""
    parts, seen, lin = {}, {}, None
    for name, d in dims.items():
        node = graph.nodes[name]
        piece = piece_cut(node, d)
        if piece is None:
            continue
        total = sum(piece["sizes"])
        lin = set(linears(graph)) if lin is None else lin
        src = next((o.producer for o in node.operands if o.producer), None)
        while src is not None and src in dims and src not in lin:
            p = graph.nodes[src]
            nxt = [o.producer for o in p.operands if o.producer in dims]
            if len(nxt) != 1 or _axis_size(p, dims[src]) != total:
                return {}, f"{src} ({p.kind}) reshapes the fused projection before its split"
            src = nxt[0]
        if src is None or src not in dims or src not in lin or _axis_size(graph.nodes[src], dims[src]) != total:
            return {}, f"{name} splits a tensor that no column-split projection makes whole"
        if parts.setdefault(src, piece["sizes"]) != piece["sizes"]:
            return {}, f"{src}'s output is split two ways ({parts[src]} and {piece['sizes']})"
        seen.setdefault(src, set()).add(name)
    # every op between a fused opener and its pieces keeps the fused axis; no other op reads it
    if parts and consumers is None:
        consumers = graph.consumers()
    for src, sizes in parts.items():
        total, stack, done = sum(sizes), [src], set()
        while stack:
            cur = stack.pop()
            for c, _ in consumers[cur]:
                if c in done or c not in dims or c in seen[src]:
                    continue
                done.add(c)
                cn = graph.nodes[c]
                if piece_cut(cn, dims[c]) is not None:
                    return {}, f"{c} splits {src}'s output on another path"
                if _axis_size(cn, dims[c]) != total:
                    return {}, f"{c} ({cn.kind}) reads the fused projection {src} whole"
                stack.append(c)
    return parts, ""
