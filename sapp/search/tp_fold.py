"""Heads carried through the data batch they are folded into (local-attention's `(b h)` windows).

local-attention packs q, k, v [b, h, n, d] as [(b h), n, d], runs its windows, rotary and masks over
that merged axis as a batch (each row on its own) and unpacks it back to [b, h, n, d] before the
output projection.  A rank holding h / tp of the heads packs [(b h/tp), n, d]: its own rows of the
merged axis, on which every op runs as on one process.  So the split rides the merged axis from the
merge to the unmerge: each op between them runs over the split on the merged axis's op dim (a rank
holds 1/tp of its rows, which the shape audit checks), and the fold's (outer, split, inner) sizes
travel with it, so that the unmerge must split the axis back at the same place.  Anything else that
reads the merged axis ends the region: a reshape merging it with more axes or splitting it at other
sizes, a cat / slice changing its length, a tensor made outside the region that runs over it (its
rows are not a rank's heads).  The capture maps a merge to its outermost axis; the reshape's
`extra["folds"]` (capture/ops_view.reshape) names every axis of it.  Pure Python over the OpGraph."""
from __future__ import annotations

import math

_RESHAPES = ("aten.reshape.default", "aten.view.default", "aten._unsafe_view.default")


def _group(node, axis: int):
    """(input axes, output axes) of the merge or unmerge of reshape `node` that holds input `axis`."""
    if str(node.target) not in _RESHAPES:
        return None
    for gi, gj in node.extra.get("folds", ()):
        if axis in gi:
            return tuple(gi), tuple(gj)
    return None


def into(node, op, axis: int):
    """(op dim, fold) where reshape `node` folds its operand's axis `axis` (the split, not the
    outermost of the merge) into a data-batch axis; fold = (outer, split, inner) sizes of that axis.
    None when it is no such fold."""
    g = _group(node, axis)
    if g is None or len(g[1]) != 1 or g[0][0] == axis:
        return None
    gi, (o,) = g
    d = node.out.dims[o]
    if not any(x.name == d and x.batch for x in node.dims):
        return None
    shape = op.shape
    return d, (math.prod(shape[gi[0]:axis]), shape[axis], math.prod(shape[axis + 1:gi[-1] + 1]))


def follow(node, op, axis: int, fold: tuple):
    """(op dim, fold or None, why) of `node` reading, at its operand's axis `axis`, a merged axis the
    split rides in as `fold`: the fold goes on where the axis passes whole and ends (None) at the
    reshape that splits it back at the fold; `why` says why neither holds ('' when one does)."""
    size = math.prod(fold)
    g = _group(node, axis)
    if g is not None:
        gi, gj = g
        if len(gi) != 1:
            return None, None, f"{node.name} merges the batch the heads are folded into with more axes"
        sizes = [node.out.shape[j] for j in gj]
        for p, j in enumerate(gj):
            if math.prod(sizes[:p]) == fold[0] and sizes[p] == fold[1]:
                return node.out.dims[j], None, ""
        return None, None, f"{node.name} splits the batch the heads are folded into as {sizes}, not at the heads"
    d = op.dims[axis] if axis < len(op.dims) else None
    dim = next((x for x in node.dims if x.name == d), None)
    if d is None or dim is None or dim.size != size:
        return None, None, f"{node.name} ({node.kind}) reads the batch the heads are folded into at another length"
    return d, fold, ""


def outside_reads(node, op, d: str) -> str:
    """Why `node` cannot combine a tensor made outside the region (`op`) with the split folded into
    its batch axis `d`: that tensor's rows run over every head ('' when it does not run over `d`)."""
    if d in op.dims and op.numel > 1 and op.shape[op.dims.index(d)] > 1:
        src = op.param or op.producer or "an input"
        return f"{node.name} combines the heads folded into the batch with {src}, whose rows are every head's"
    return ""
