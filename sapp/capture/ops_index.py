"""Indexing, scans and routing: gather / index / index_select / index_put / scatter(_add), cumsum /
diff, topk / sort / histc.  These move or rank elements rather than compute on them; FLOPs count
the elements touched (a compare or an add each), so a data-movement op is priced by its bytes.

Routing ops (a mixture-of-experts router's topk, sort, histc) run per data shard in a data-parallel
program: each replica routes its own tokens.  Their token axis is therefore splittable exactly when it
carries the data batch (`Spec.local`), and never along a non-batch axis they rank or count over."""
from __future__ import annotations

import math

from .opspec import Spec, TRef, _adims, _arg, _axis, _bcast, prod


def _is_batch(t, ax):
    return ax < len(t.batch) and bool(t.batch[ax])


def _names(n):
    return tuple(f"a{i}" for i in range(n))


def _same_or_none(shape, out, skip=()):
    """Axis i of a same-rank input maps to a<i> where sizes agree (axes in `skip` never map)."""
    if len(shape) != len(out):
        return (None,) * len(shape)
    return tuple(f"a{i}" if i not in skip and s == out[i] else None for i, s in enumerate(shape))


def cumsum(c):
    """Prefix sum along `dim` (also cumprod / cummax): the scanned axis stays whole."""
    r = c.out_shape
    d = _axis(int(_arg(c, 1, "dim", 0)), len(r)) if r else 0
    unsplit = {d} if r else set()
    return Spec("other", _adims(r, unsplit), [_same_or_none(c.ins[0].shape, r)], _names(len(r)),
                float(prod(r)), (), local=[f"a{d}"] if r else [])


def diff(c):
    """x[..., 1:] - x[..., :-1] along `dim` (prepend/append tensors join that axis): it stays whole."""
    r = c.out_shape
    d = _axis(int(_arg(c, 2, "dim", -1)), len(r))
    ind = [_same_or_none(t.shape, r, skip={d}) for t in c.ins]
    return Spec("other", _adims(r, {d}), ind, _names(len(r)), float(prod(r)), ())


def gather(c):
    """out[i] = x[index[i] along dim]: out has the index's shape; x's other axes map where sizes
    agree; the gathered axis stays whole (any element may be read)."""
    r = c.out_shape
    x = c.ins[0]
    d = _axis(int(_arg(c, 1, "dim", 0)), len(x.shape))
    local = _is_batch(x, d)
    xd = _same_or_none(x.shape, r, skip=() if local else {d})
    if local and len(x.shape) == len(r):
        xd = tuple(f"a{d}" if i == d else v for i, v in enumerate(xd))
    ind = [xd] + [_same_or_none(t.shape, r) for t in c.ins[1:]]
    return Spec("other", _adims(r, set() if local else {d}), ind, _names(len(r)), 0.0,
                ("in1",) if c.ins[1:] else (), trusted=local)


def index_select(c):
    """out = x.index_select(dim, idx): axis `dim` of the output runs over the index."""
    x, idx = c.ins[0], c.ins[1]
    r = c.out_shape
    d = _axis(int(_arg(c, 1, "dim", 0)), len(x.shape))
    xd = tuple(None if i == d else f"a{i}" for i in range(len(x.shape)))
    return Spec("other", _adims(r), [xd, (f"a{d}",) if len(idx.shape) == 1 else (None,) * len(idx.shape)],
                _names(len(r)), 0.0, ("in1",))


def index(c):
    """Advanced indexing x[i0, i1, ...] (aten.index.Tensor, None = a full slice).  The output is the
    leading unindexed axes, the indices' broadcast shape, then the trailing unindexed axes (indexed
    axes that are not adjacent move the broadcast block to the front, as numpy does).  Unindexed axes
    of x map to the output; each index tensor maps onto the broadcast block; indexed axes of x stay
    whole."""
    x = c.ins[0]
    r = c.out_shape
    idx = list(_arg(c, 1, "indices", []) or [])
    pos = [i for i, t in enumerate(idx) if isinstance(t, TRef)]
    if not pos:
        return Spec("other", _adims(r), [_bcast(x.shape, r)], _names(len(r)), 0.0, ())
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    bl = max(len(c.ins[idx[i].i].shape) for i in pos)
    start = pos[0] if adjacent else 0
    rest = [a for a in range(len(x.shape)) if a not in pos]
    xd = []
    for ax in range(len(x.shape)):
        if ax in pos:
            xd.append(None)
            continue
        if adjacent:
            o = ax if ax < start else start + bl + (ax - pos[-1] - 1)
        else:
            o = bl + rest.index(ax)
        xd.append(f"a{o}" if o < len(r) and r[o] == x.shape[ax] else None)
    local = pos[0] if len(pos) == 1 and _is_batch(x, pos[0]) else None
    if local is not None:
        # rows of the data batch picked by index (a router gathering its tokens): each shard
        # picks from its own rows, so the batch axis and the picked rows split together
        xd[local] = f"a{start}"
    ind = [tuple(xd)] + [(None,) * len(t.shape) for t in c.ins[1:]]
    for i in pos:
        t = c.ins[idx[i].i]
        off = start + bl - len(t.shape)
        ind[idx[i].i] = tuple(f"a{off + j}" if 0 <= off + j < len(r) and s == r[off + j] and s != 1 else None
                              for j, s in enumerate(t.shape))
    return Spec("other", _adims(r), ind, _names(len(r)), 0.0, tuple(f"in{i}" for i in range(1, len(c.ins))),
                trusted=local is not None)


def index_put(c):
    """x.index_put(indices, values[, accumulate]) / scatter / scatter_add / index_add: the output
    is x with some rows written; the written axes stay whole.  An accumulating write is one add per
    value."""
    x = c.ins[0]
    r = c.out_shape
    if c.op in ("index_put", "_index_put_impl", "_unsafe_index_put"):
        idx = list(_arg(c, 1, "indices", []) or [])
        written = {i for i, t in enumerate(idx) if isinstance(t, TRef)}
        acc = bool(_arg(c, 3, "accumulate", False))
    else:
        d = _axis(int(_arg(c, 1, "dim", 0)), len(r))
        written = {d}
        acc = c.op in ("scatter_add", "index_add", "scatter_reduce")
    values = c.ins[-1]
    ind = [_same_or_none(x.shape, r)] + [(None,) * len(t.shape) for t in c.ins[1:]]
    if c.op in ("scatter", "scatter_add", "scatter_reduce") and len(c.ins) >= 3:
        ind = [_same_or_none(x.shape, r)] + [_same_or_none(t.shape, r, skip=written) for t in c.ins[1:]]
    flops = float(prod(values.shape)) if acc else 0.0
    # a write along the data batch (a router's inverse permutation) happens per shard
    return Spec("other", _adims(r, written), ind, _names(len(r)), flops, (), local=[f"a{d}" for d in written])


def topk(c):
    """The k largest along `dim` (values and indices): about n·log2(k) compares per row."""
    x = c.ins[0]
    r = c.out_shape
    k = int(_arg(c, 1, "k", 1))
    d = _axis(int(_arg(c, 2, "dim", -1)), len(x.shape))
    ind = [tuple(None if i == d else f"a{i}" for i in range(len(x.shape)))]
    return Spec("other", _adims(r, {d}), ind, _names(len(r)), float(prod(x.shape)) * max(1.0, math.log2(max(k, 1))),
                (), extra={"k": k})


def sort(c):
    """Sort (or argsort) along `dim`: n·log2(n) compares per row.  A sort over the data batch (a
    router ordering its tokens by expert) runs per shard: splittable along a batch axis only."""
    x = c.ins[0]
    r = c.out_shape
    d = _axis(int(_arg(c, 1, "dim", -1)), len(x.shape)) if r else 0
    n = x.shape[d] if x.shape else 1
    return Spec("other", _adims(r, {d}), [_names(len(x.shape))], _names(len(r)),
                float(prod(x.shape)) * max(1.0, math.log2(max(n, 1))), (), local=[f"a{d}"])


def histc(c):
    """Histogram (histc / bincount): one compare-and-add per input element.  Splitting the input
    leaves each shard a partial count (a sum: the output is Partial)."""
    x = c.ins[0]
    r = c.out_shape
    dims = [(f"i{j}", int(s), True) for j, s in enumerate(x.shape)] + [(f"a{i}", int(s), False) for i, s in enumerate(r)]
    ind = [tuple(f"i{j}" for j in range(len(x.shape)))] + [(None,) * len(t.shape) for t in c.ins[1:]]
    return Spec("other", dims, ind, _names(len(r)), float(prod(x.shape)), ())


def one_hot(c):
    r = c.out_shape
    ind = [_names(len(c.ins[0].shape))]
    return Spec("other", _adims(r, {len(r) - 1}), ind, _names(len(r)), 0.0, ())
