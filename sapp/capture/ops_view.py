"""Views and data movement: reshape / permute / expand / slice / select / cat, copies and tensor
creation.  No FLOPs; views move no bytes."""
from __future__ import annotations

from .opspec import Spec, _adims, _arg, _axis, _bcast, generic, prod

def reshape_groups(ish, osh):
    """Pair up runs of input and output axes with equal products.  Size-1 axes on one side only
    get their own group with nothing on the other side."""
    groups, i, j = [], 0, 0
    while i < len(ish) or j < len(osh):
        if i < len(ish) and ish[i] == 1 and (j >= len(osh) or osh[j] != 1):
            groups.append(([i], []))
            i += 1
            continue
        if j < len(osh) and osh[j] == 1 and (i >= len(ish) or ish[i] != 1):
            groups.append(([], [j]))
            j += 1
            continue
        if i >= len(ish) or j >= len(osh):
            return None
        gi, gj, pi, pj = [i], [j], ish[i], osh[j]
        i += 1
        j += 1
        while pi != pj:
            if pi < pj and i < len(ish):
                gi.append(i)
                pi *= ish[i]
                i += 1
            elif pj < pi and j < len(osh):
                gj.append(j)
                pj *= osh[j]
                j += 1
            else:
                return None
        groups.append((gi, gj))
    return groups


def _view_spec(c, in_dims, unsplit, also=(), copies=False):
    r = c.out_shape
    return Spec("view", _adims(r, unsplit), in_dims, tuple(f"a{i}" for i in range(len(r))), 0.0, (),
                copies=copies, also=list(also))


def reshape(c):
    ish, osh = tuple(c.ins[0].shape), tuple(c.out_shape)
    groups = reshape_groups(ish, osh)
    if groups is None:
        return generic(c)
    ind = [None] * len(ish)
    unsplit, also, folds = set(), [], []
    for gi, gj in groups:
        if not gj:
            continue
        if not gi:
            unsplit.add(gj[0])
            continue
        # Merged axes take the first input axis's dim; split-off output axes after the first
        # cannot be split (their shards would not be contiguous in the input).
        ind[gi[0]] = f"a{gj[0]}"
        unsplit.update(gj[1:])
        also += [(0, a, f"a{gj[0]}") for a in gi[1:]]
        if len(gi) > 1 or len(gj) > 1:      # (input axes, output axes) of one merge or unmerge
            folds.append((tuple(gi), tuple(gj)))
    s = _view_spec(c, [tuple(ind)] + [() for _ in c.ins[1:]], unsplit, also)
    if folds:
        s.extra["folds"] = folds            # read by the tp layout: heads carried inside a merged batch
    s.trusted = True
    return s


def permute(c):
    n = len(c.ins[0].shape)
    if c.op in ("transpose", "swapaxes", "swapdims"):
        d0, d1 = _axis(int(c.args[1]), n), _axis(int(c.args[2]), n)
        perm = list(range(n))
        perm[d0], perm[d1] = perm[d1], perm[d0]
    elif c.op in ("t", "numpy_T"):
        perm = list(range(n))[::-1]
    else:
        perm = [_axis(int(p), n) for p in _arg(c, 1, "dims")]
    ind = [None] * n
    for i, p in enumerate(perm):
        ind[p] = f"a{i}"
    return _view_spec(c, [tuple(ind)], set())


def movedim(c):
    """movedim(x, source, destination): a permutation of x's axes."""
    n = len(c.ins[0].shape)
    src, dst = _arg(c, 1, "source"), _arg(c, 2, "destination")
    src = [_axis(int(a), n) for a in (src if isinstance(src, (list, tuple)) else [src])]
    dst = [_axis(int(a), n) for a in (dst if isinstance(dst, (list, tuple)) else [dst])]
    rest = iter(a for a in range(n) if a not in src)
    perm = [None] * n                        # output axis -> input axis
    for a, b in zip(src, dst):
        perm[b] = a
    perm = [p if p is not None else next(rest) for p in perm]
    ind = [None] * n
    for i, p in enumerate(perm):
        ind[p] = f"a{i}"
    return _view_spec(c, [tuple(ind)], set())


def windows(c):
    """Tensor.unfold(dim, size, step): windows of `size` along `dim`, stepped by `step`, as a new last
    axis (local-attention's look-around).  The windows overlap, so `dim` and the new axis stay whole;
    every other axis maps straight.  A view: no FLOPs, no bytes."""
    x = c.ins[0]
    n = len(x.shape)
    d = _axis(int(_arg(c, 1, "dimension")), n)
    ind = tuple(None if i == d else f"a{i}" for i in range(n))
    return _view_spec(c, [ind], {d, n})


def expand(c):
    r = c.out_shape
    return _view_spec(c, [_bcast(c.ins[0].shape, r)] + [() for _ in c.ins[1:]], set(),
                      copies=c.op in ("repeat", "expand_copy"))


def identity(c):
    r = c.out_shape
    same = tuple(c.ins[0].shape) == tuple(r)
    ind = tuple(f"a{i}" for i in range(len(r))) if same else _bcast(c.ins[0].shape, r)
    return _view_spec(c, [ind] + [() for _ in c.ins[1:]], set(),
                      copies=c.op in ("clone", "contiguous", "_to_copy", "to", "copy"))


def slice_(c):
    """slice / narrow / split pieces: the cut axis stays whole unless the slice is the full axis.

    A piece of split / chunk (`piece`: its index and every piece's size) keeps the link from the cut
    axis to its own, with that dim unsplittable: only tensor parallelism's head-aware layout splits it
    (search/tp_layout.py), where each rank's share of the fused input holds its share of every piece
    in order, so the rank's piece is the piece's share.  Pieces cut along the data batch keep no link
    (a rank's chunk of its batch is not its share of the chunk)."""
    x = c.ins[0]
    n = len(x.shape)
    r = c.out_shape
    d = _axis(int(_arg(c, 1, "dim", 0)), n)
    piece = c.kwargs.get("piece")
    fused = (piece is not None and x.shape[d] != r[d] and not (x.batch and x.batch[d])
             and sum(piece[1]) == x.shape[d] and piece[1][piece[0]] == r[d])
    ind = tuple(f"a{i}" if (i != d or x.shape[i] == r[i] or fused) else None for i in range(n))
    unsplit = set() if x.shape[d] == r[d] else {d}
    s = _view_spec(c, [ind], unsplit)
    if fused:
        s.trusted = True            # the cut axis links sizes that differ, on purpose
        s.extra["piece"] = {"axis": d, "index": int(piece[0]), "sizes": [int(v) for v in piece[1]]}
    return s


def select(c):
    x = c.ins[0]
    n = len(x.shape)
    d = _axis(int(_arg(c, 1, "dim", 0)), n)
    ind, j = [], 0
    for i in range(n):
        if i == d:
            ind.append(None)
        else:
            ind.append(f"a{j}")
            j += 1
    return _view_spec(c, [tuple(ind)] + [() for _ in c.ins[1:]], set())


def cat(c):
    """cat(tensors, dim): the cat axis is kept whole (a shard of it would be pieces of two inputs),
    except where one input is the whole output (the others empty: Performer's cat of its global heads
    with no local heads), which maps straight."""
    r = c.out_shape
    d = _axis(int(_arg(c, 1, "dim", 0)), len(r))
    whole = [t for t in c.ins if len(t.shape) == len(r) and t.shape[d] == r[d]]
    alone = len(whole) == 1 and all(t is whole[0] or 0 in tuple(t.shape) for t in c.ins)
    ind = [tuple(f"a{i}" if ((i != d or alone) and t.shape[i] == r[i]) else None for i in range(len(t.shape)))
           if len(t.shape) == len(r) else tuple(None for _ in t.shape) for t in c.ins]
    return _view_spec(c, ind, set() if alone else {d}, copies=True)


def stack(c):
    """stack(tensors, dim): a new axis at `dim` (kept whole, like cat's axis); the others map straight."""
    r = c.out_shape
    d = _axis(int(_arg(c, 1, "dim", 0)), len(r))
    ind = [tuple(f"a{j if j < d else j + 1}" if len(t.shape) == len(r) - 1 else None for j in range(len(t.shape)))
           for t in c.ins]
    return _view_spec(c, ind, {d}, copies=True)


def repeat_interleave(c):
    """repeat_interleave(x, r, dim): output row i is input row i // r along `dim`, so a contiguous shard
    of the output is the repeat of a contiguous shard of the input (key/value heads repeated to the
    query heads: a tp shard keeps whole groups).  The dim takes the input's size, so a split must
    divide the rows before repeating.  Without `dim` the input is flattened first: the output is kept
    whole.  Copies; no FLOPs."""
    x = c.ins[0]
    r = c.out_shape
    dim = _arg(c, 2, "dim", None)
    if dim is None or len(c.ins) > 1 or len(x.shape) != len(r):     # flattened, or per-row repeats
        return _view_spec(c, [tuple(None for _ in x.shape)] + [() for _ in c.ins[1:]], set(range(len(r))),
                          copies=True)
    d = _axis(int(dim), len(r))
    s = _view_spec(c, [tuple(f"a{i}" for i in range(len(r)))], set(), copies=True)
    s.dims[d] = (f"a{d}", int(x.shape[d]), True)
    s.trusted = True
    return s


def pad(c):
    """pad / constant_pad_nd(x, pad): the padded axes grow (kept whole: a shard's border would be
    another shard's data); the others map straight.  Copies; no FLOPs."""
    x = c.ins[0]
    n = len(x.shape)
    widths = list(_arg(c, 1, "pad", ()))
    padded = {n - 1 - j for j in range(len(widths) // 2) if widths[2 * j] or widths[2 * j + 1]}
    padded |= {i for i in range(n) if x.shape[i] != c.out_shape[i]}
    return _view_spec(c, [tuple(None if i in padded else f"a{i}" for i in range(n))] + [() for _ in c.ins[1:]],
                      padded, copies=True)


def im2col(c):
    """im2col / unfold(x [B, C, H, W], kernel): [B, C * kh * kw, L] sliding-window columns.  Output
    row c * kh * kw + j comes from channel c, so a contiguous shard of the rows is a shard of the
    channels (the dim takes the channel count); the windows overlap, so L stays whole.  Copies."""
    x = c.ins[0]
    r = c.out_shape
    if len(x.shape) != 4 or len(r) != 3:
        return generic(c)
    s = _view_spec(c, [("a0", "a1", None, None)], {2}, copies=True)
    s.dims[1] = ("a1", int(x.shape[1]), True)
    s.trusted = True
    return s


def col2im(c):
    """col2im / fold(cols [B, C * kh * kw, L], output_size, kernel): im2col's inverse, each column's
    value added into its window of [B, C, H, W] (MobileViTv2 folds its patches back).  Column row
    c * kh * kw + j goes to channel c, so the rows map to the channels (the dim takes the channel
    count); H and W stay whole (windows may overlap).  One add per input element."""
    x = c.ins[0]
    r = c.out_shape
    if len(x.shape) != 3 or len(r) != 4 or x.shape[1] % max(int(r[1]), 1):
        return generic(c)
    return Spec("other", _adims(r, {2, 3}), [("a0", "a1", None)], ("a0", "a1", "a2", "a3"),
                float(prod(x.shape)), (), trusted=True)


def as_strided(c):
    """as_strided(x, size, stride): any window over x's storage (Longformer's overlapping chunks).
    Only a leading axis that walks x's own leading axis (same size, x's contiguous row stride) maps to
    it, so the batch still splits; every other axis is kept whole.  A view: no bytes, no FLOPs."""
    x, r = c.ins[0], c.out_shape
    stride = list(_arg(c, 2, "stride", ()))
    lead = (len(x.shape) > 0 and len(r) > 0 and stride and int(r[0]) == int(x.shape[0])
            and int(stride[0]) == prod(x.shape[1:]))
    ind = tuple("a0" if (i == 0 and lead) else None for i in range(len(x.shape)))
    return _view_spec(c, [ind], set(range(1 if lead else 0, len(r))))


def creation(c):
    r = c.out_shape
    # zeros_like(x) & co. read nothing from x, but the new tensor is laid out like it: the data
    # batch flag follows (`also`), so a buffer a router fills per shard splits with the batch
    also = [(i, ax, f"a{ax}") for i, t in enumerate(c.ins) if tuple(t.shape) == tuple(r)
            for ax in range(len(r))] if c.op.endswith("_like") else []
    return Spec("other", _adims(r), [tuple(None for _ in t.shape) for t in c.ins],
                tuple(f"a{i}" for i in range(len(r))), 0.0, (), also=also)


