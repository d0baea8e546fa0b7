"""Normalisation, softmax, reductions, pooling and losses: ops that combine elements along some
axes (those axes stay whole unless the combination is a sum, whose split leaves a Partial)."""
from __future__ import annotations

from .opspec import Spec, TRef, _act_saves, _adims, _arg, _axis, _bcast, _bias_dims, generic, prod
from .ops_pointwise import elementwise

def layer_norm(c):
    r = c.out_shape
    ns = _arg(c, 1, "normalized_shape", [r[-1]])
    nn_ = len(ns) if isinstance(ns, (list, tuple)) else 1
    unsplit = set(range(len(r) - nn_, len(r)))
    ind = [tuple(f"a{i}" for i in range(len(r)))]
    for t in c.ins[1:]:
        ind.append(tuple(f"a{len(r) - len(t.shape) + j}" for j in range(len(t.shape))))
    return Spec("norm", _adims(r, unsplit), ind, tuple(f"a{i}" for i in range(len(r))), 5.0 * prod(r),
                _act_saves(c, [0]), extra={"eps": _arg(c, 4, "eps", 1e-5) if c.op == "layer_norm" else None})


def rms_norm(c):
    s = layer_norm(c)
    s.flops = 4.0 * prod(c.out_shape)
    return s


def batch_norm(c):
    r = c.out_shape
    # Spatial axes stay whole; the batch axis splits over dp, where the emitter syncs the statistics
    # (emit/dp/batch_stats.py).  `batch_stats`: training mode, statistics over the batch (not the running
    # ones): every replica must see the global batch's, and a micro-batch's differ (search: one only).
    unsplit = set(range(2, len(r)))
    ind = [tuple(f"a{i}" for i in range(len(r)))] + [("a1",) for _ in c.ins[1:]]
    # batch_norm / native_batch_norm / _native_batch_norm_legit(_functional): training is argument 5;
    # _native_batch_norm_legit.no_stats (no running buffers) has it at 3
    at = 3 if len(c.args) > 3 and isinstance(c.args[3], bool) else 5
    extra = {"batch_stats": True} if bool(_arg(c, at, "training", False)) else {}
    return Spec("norm", _adims(r, unsplit), ind, tuple(f"a{i}" for i in range(len(r))), 5.0 * prod(r),
                _act_saves(c, [0]), extra=extra)


def group_norm(c):
    r = c.out_shape
    ind = [tuple(f"a{i}" for i in range(len(r)))] + [("a1",) for _ in c.ins[1:]]
    return Spec("norm", _adims(r, set(range(1, len(r)))), ind, tuple(f"a{i}" for i in range(len(r))),
                5.0 * prod(r), _act_saves(c, [0]))


def softmax(c):
    r = c.out_shape
    ax = _axis(int(_arg(c, 1, "dim", -1)), len(r))
    return Spec("softmax", _adims(r, {ax}), [_bcast(c.ins[0].shape, r)], tuple(f"a{i}" for i in range(len(r))),
                5.0 * prod(r), ("out",), extra={"axis": ax})


def reduction(c):
    if len(c.ins) > 1 and isinstance(_arg(c, 1, "other"), TRef):
        return elementwise(c)        # max(a, b) / min(a, b): the binary, element-wise overload
    x = c.ins[0]
    n = len(x.shape)
    if c.op in ("sum", "mean") and len(c.args) < 2 and "dim" not in c.kwargs:
        red = set(range(n))
        keep = False
    else:
        # norm(x, p, dim, keepdim) / linalg_vector_norm(x, ord, dim, keepdim): the order comes first
        at = 2 if c.op in ("norm", "linalg_vector_norm") else 1
        d = _arg(c, at, "dim", None)
        d = list(range(n)) if d is None else ([d] if isinstance(d, int) else list(d))
        red = {_axis(int(a), n) for a in d}
        keep = bool(_arg(c, at + 1, "keepdim", False))
    summing = c.op in ("sum", "mean", "nansum")
    dims = [(f"a{i}", int(s), summing or i not in red) for i, s in enumerate(x.shape)]
    out = tuple((None if i in red else f"a{i}") for i in range(n) if keep or i not in red)
    saves = ("in0", "out") if c.op in ("amax", "amin", "max", "min", "prod", "norm", "logsumexp") else ()
    return Spec("reduction", dims, [tuple(f"a{i}" for i in range(n))], out, float(prod(x.shape)),
                _act_saves(c, [0]) if saves else ())


def pool(c):
    r = c.out_shape
    x = c.ins[0]
    nsp = len(r) - 2
    kernel = _arg(c, 1, "kernel_size", None)
    dims = [("a0", int(r[0]), True), ("a1", int(r[1]), True)] + [(f"a{i}", int(s), False)
                                                                for i, s in enumerate(r) if i >= 2]
    ind = [("a0", "a1") + (None,) * nsp]
    win = prod(x.shape[2:]) / max(1, prod(r[2:]))
    if c.op.startswith("max_pool") and kernel is not None:
        win = prod(kernel) if isinstance(kernel, (list, tuple)) else kernel ** nsp
    saves = _act_saves(c, [0]) + ("out",) if c.op.startswith("max_pool") else ()
    return Spec("pool", dims, ind, tuple(f"a{i}" for i in range(len(r))), float(prod(r) * win), saves)


# ---- losses ---------------------------------------------------------------------------------
def _reduced(c, idx):
    red = _arg(c, idx, "reduction", 1)
    return red in (1, 2, "mean", "sum")


def cross_entropy(c):
    x = c.ins[0]
    # Classes stay whole: vocab-parallel loss (DTensor loss_parallel) is not emitted yet.
    dims = [("b0", int(x.shape[0]), True), ("v", int(x.shape[1]), False)] + \
        [(f"b{i}", int(s), True) for i, s in enumerate(x.shape[2:], 1)]
    xd = ("b0", "v") + tuple(f"b{i}" for i in range(1, len(x.shape) - 1))
    td = ("b0",) + tuple(f"b{i}" for i in range(1, len(x.shape) - 1))
    ind = [xd, td] + [("v",) for _ in c.ins[2:]]
    out = () if _reduced(c, 3 if c.op != "nll_loss" else 3) else td
    return Spec("loss", dims, ind, out, 4.0 * prod(x.shape), _act_saves(c, [0, 1]))


def pointwise_loss(c):
    x = c.ins[0]
    dims = [("b0" if i == 0 else f"b{i}", int(s), True) for i, s in enumerate(x.shape)]
    names = tuple(d[0] for d in dims)
    ind = [names] + [_bias_dims(t.shape, names) if t.shape else () for t in c.ins[1:]]
    red_idx = {"binary_cross_entropy_with_logits": 4, "mse_loss": 2, "l1_loss": 2, "smooth_l1_loss": 2,
               "binary_cross_entropy": 3, "huber_loss": 2}.get(c.op, 2)
    out = () if _reduced(c, red_idx) else names
    return Spec("loss", dims, ind, out, 4.0 * prod(x.shape), _act_saves(c, [0, 1]))




def upsample(c):
    """upsample_{nearest,bilinear,bicubic}*(x [B, C, *spatial]): batch and channels map straight, the
    resized spatial axes stay whole (an output pixel reads input pixels across any cut).  FLOPs per
    output element: 0 nearest (a gather), 2 per neighbour blended otherwise (linear 2, bilinear 4,
    trilinear 8, bicubic 16 neighbours)."""
    x, r = c.ins[0], c.out_shape
    if len(x.shape) != len(r) or len(r) < 3:
        return generic(c)
    nsp = len(r) - 2
    taps = 0 if "nearest" in c.op else (16 if "bicubic" in c.op else 2 ** nsp)
    dims = [(f"a{i}", int(s), i < 2) for i, s in enumerate(r)]
    ind = [tuple(f"a{i}" if i < 2 else None for i in range(len(r)))] + [() for _ in c.ins[1:]]
    return Spec("other", dims, ind, tuple(f"a{i}" for i in range(len(r))), 2.0 * taps * prod(r), ())
