"""Per-operator rules: ATen op -> iteration space (dims), operand/out dim mapping, FLOPs, saves.

A handler gets an `OpCall` (the op name, its tensor inputs in argument order, the other arguments,
the output shape) and returns a `Spec`.  Names follow docs/ARCHITECTURE.md: linear `b0.., n, k`;
batched matmul `b0.., m, n, k`; embedding `b0.., v, h`; conv `b0, o, c, <spatial>`; everything
else `a0, a1, ...` over the output axes.  FLOP conventions: matmul/conv 2 per multiply-add (bias
adds not counted, as torch.utils.flop_counter), element-wise 1 per output element, normalisation and
softmax 5 per element, views and lookups 0."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Tin:
    """One tensor input of an op call."""
    shape: tuple
    dtype: str
    is_param: bool = False
    is_act: bool = False          # produced by another node (an activation)


@dataclass
class OpCall:
    op: str                       # ATen packet name without trailing "_" of in-place variants
    ins: list                     # [Tin] in argument order
    args: tuple                   # positional args, tensors replaced by their index in `ins` (TRef)
    kwargs: dict
    out_shape: tuple
    out_dtype: str


@dataclass(frozen=True)
class TRef:
    i: int


@dataclass
class Spec:
    kind: str
    dims: list                    # [(name, size, splittable)]
    in_dims: list                 # per input: tuple of dim name or None per axis
    out_dims: tuple
    flops: float = 0.0
    saves: tuple = ()
    copies: bool = True           # False: a pure view, moves no bytes
    also: list = field(default_factory=list)   # extra (input, axis, dim) links, for batch flags only
    extra: dict = field(default_factory=dict)
    generic: bool = False         # unknown op: only batch dims may be split
    trusted: bool = False         # mapping may link axes of different sizes on purpose (reshape)


def prod(xs):
    n = 1
    for x in xs:
        n *= int(x)
    return n


def _arg(c, i, name=None, default=None):
    if len(c.args) > i:
        return c.args[i]
    return c.kwargs.get(name, default)


def _axis(d, n):
    return d + n if d < 0 else d


def _adims(shape, unsplit=()):
    return [(f"a{i}", int(s), i not in unsplit) for i, s in enumerate(shape)]


def _bcast(tin_shape, out_shape):
    """Right-aligned broadcast mapping of an input onto output axes a<i>."""
    r, n = len(out_shape), len(tin_shape)
    dims = []
    for j, s in enumerate(tin_shape):
        i = r - n + j
        dims.append(f"a{i}" if 0 <= i < r and s == out_shape[i] and s != 1 else None)
    return tuple(dims)


def _act_saves(c, idxs):
    return tuple(f"in{i}" for i in idxs if i < len(c.ins) and c.ins[i].is_act)


# ---- element-wise ----------------------------------------------------------------------------
SAVE_OUT = {"relu", "sigmoid", "tanh", "exp", "rsqrt", "sqrt", "hardsigmoid"}
SAVE_IN = {"gelu", "silu", "log", "pow", "erf", "sin", "cos", "leaky_relu", "elu", "softplus",
           "hardtanh", "mish", "abs", "log1p", "reciprocal", "hardswish", "clamp", "clamp_min",
           "clamp_max", "square"}
SAVE_ALL_ACT = {"mul", "div", "maximum", "minimum", "atan2", "where"}
NO_SAVE = {"add", "sub", "rsub", "neg", "masked_fill", "eq", "ne", "le", "lt", "ge", "gt",
           "__and__", "__or__", "__xor__", "bitwise_not", "bitwise_and", "bitwise_or",
           "logical_not", "logical_and", "logical_or", "fill", "zero", "copy", "lerp", "sign",
           "floor", "ceil", "round", "trunc", "remainder", "fmod", "isnan", "isinf", "nan_to_num",
           "scalar_tensor", "floor_divide", "logical_xor", "type_as", "_to_copy", "to", "addcmul",
           "addcdiv", "triu", "tril", "bitwise_xor"}
ELEMENTWISE = SAVE_OUT | SAVE_IN | SAVE_ALL_ACT | NO_SAVE


def elementwise(c):
    r = c.out_shape
    if c.op in SAVE_OUT:
        saves = ("out",)
    elif c.op in SAVE_IN:
        saves = _act_saves(c, [0])
    elif c.op in SAVE_ALL_ACT:
        tensors = [i for i, t in enumerate(c.ins) if len(t.shape) > 0]
        saves = _act_saves(c, tensors) if len(tensors) > 1 else ()
    else:
        saves = ()
    flops = 0.0 if c.op in ("_to_copy", "to", "type_as", "copy", "fill", "zero") else float(prod(r))
    if c.op in ("tril", "triu"):
        # Not quite element-wise (position dependent) but keeps shape; its last two axes stay whole.
        return Spec("elementwise", _adims(r, {len(r) - 1, len(r) - 2}), [_bcast(t.shape, r) for t in c.ins],
                    tuple(f"a{i}" for i in range(len(r))), flops, saves)
    return Spec("elementwise", _adims(r), [_bcast(t.shape, r) for t in c.ins],
                tuple(f"a{i}" for i in range(len(r))), flops, saves)


def dropout(c):
    p = float(_arg(c, 1, "p", 0.5))
    train = bool(_arg(c, 2, "train", True))
    r = c.out_shape
    active = p > 0 and train
    return Spec("dropout", _adims(r), [_bcast(c.ins[0].shape, r)], tuple(f"a{i}" for i in range(len(r))),
                float(prod(r)) if active else 0.0, ("mask",) if active else (), copies=active,
                extra={"p": p})


# ---- contractions ----------------------------------------------------------------------------
def linear(c):
    x, w = c.ins[0], c.ins[1]
    lead = x.shape[:-1]
    k, n = x.shape[-1], w.shape[0]
    bd = [f"b{i}" for i in range(len(lead))]
    dims = [(bd[i], int(s), True) for i, s in enumerate(lead)] + [("n", int(n), True), ("k", int(k), True)]
    ind = [tuple(bd) + ("k",), ("n", "k")]
    if len(c.ins) > 2:
        ind.append(_bias_dims(c.ins[2].shape, tuple(bd) + ("n",)))
    return Spec("matmul", dims, ind, tuple(bd) + ("n",), 2.0 * prod(lead) * n * k, _act_saves(c, [0, 1]))


def _bias_dims(shape, out_dims):
    r, n = len(out_dims), len(shape)
    return tuple(out_dims[r - n + j] if s != 1 else None for j, s in enumerate(shape))


def addmm(c):
    bias, a, b = c.ins[0], c.ins[1], c.ins[2]
    m, k = a.shape
    n = b.shape[1]
    dims = [("b0", int(m), True), ("n", int(n), True), ("k", int(k), True)]
    ind = [_bias_dims(bias.shape, ("b0", "n")), ("b0", "k"), ("k", "n")]
    return Spec("matmul", dims, ind, ("b0", "n"), 2.0 * m * n * k, _act_saves(c, [1, 2]))


def matmul(c):
    a, b = c.ins[0], c.ins[1]
    if len(a.shape) < 2 or len(b.shape) < 2:
        return generic(c)
    k = a.shape[-1]
    if len(b.shape) == 2 and c.op == "matmul":       # x @ W: linear-style naming
        lead = a.shape[:-1]
        n = b.shape[1]
        bd = [f"b{i}" for i in range(len(lead))]
        dims = [(bd[i], int(s), True) for i, s in enumerate(lead)] + [("n", int(n), True), ("k", int(k), True)]
        return Spec("matmul", dims, [tuple(bd) + ("k",), ("k", "n")], tuple(bd) + ("n",),
                    2.0 * prod(lead) * n * k, _act_saves(c, [0, 1]))
    out = c.out_shape
    lead = out[:-2]
    m, n = out[-2], out[-1]
    bd = [f"b{i}" for i in range(len(lead))]
    dims = [(bd[i], int(s), True) for i, s in enumerate(lead)] + [("m", int(m), True), ("n", int(n), True),
                                                                    ("k", int(k), True)]

    def lead_map(shape):
        nl = len(shape) - 2
        return tuple(bd[len(lead) - nl + j] if shape[j] == lead[len(lead) - nl + j] and shape[j] != 1 else None
                     for j in range(nl))
    ind = [lead_map(a.shape) + ("m", "k"), lead_map(b.shape) + ("k", "n")]
    if c.op == "baddbmm":                              # baddbmm(input, b1, b2): input is added
        bias, a, b = c.ins[0], c.ins[1], c.ins[2]
        ind = [_bias_dims(bias.shape, tuple(bd) + ("m", "n")), lead_map(a.shape) + ("m", "k"),
               lead_map(b.shape) + ("k", "n")]
        k = a.shape[-1]
        dims[-1] = ("k", int(k), True)
        saves = _act_saves(c, [1, 2])
    else:
        saves = _act_saves(c, [0, 1])
    return Spec("matmul", dims, ind, tuple(bd) + ("m", "n"), 2.0 * prod(lead) * m * n * k, saves)


def sdpa(c):
    q, k, v = c.ins[0], c.ins[1], c.ins[2]
    out = c.out_shape
    lead = out[:-2]
    L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    bd = [f"b{i}" for i in range(len(lead))]
    # The key/value sequence and head dims stay whole: splitting them needs ring/flash-decoding
    # style kernels that emit does not produce.
    dims = [(bd[i], int(s), True) for i, s in enumerate(lead)] + [
        ("m", int(L), True), ("n", int(S), False), ("k", int(E), False), ("j", int(Ev), False)]

    def lead_map(shape):
        nl = len(shape) - 2
        return tuple(bd[len(lead) - nl + j] if 0 <= len(lead) - nl + j and shape[j] == lead[len(lead) - nl + j]
                     and shape[j] != 1 else None for j in range(nl))
    ind = [lead_map(q.shape) + ("m", "k"), lead_map(k.shape) + ("n", "k"), lead_map(v.shape) + ("n", "j")]
    for t in c.ins[3:]:                                # attn_mask broadcast to [..., L, S]
        sh = t.shape
        full = tuple(bd) + ("m", "n")
        fs = tuple(lead) + (L, S)
        ind.append(tuple(full[len(full) - len(sh) + j] if sh[j] == fs[len(fs) - len(sh) + j] and sh[j] != 1 else None
                         for j in range(len(sh))))
    flops = 2.0 * prod(lead) * L * S * (E + Ev)
    causal = bool(_arg(c, 5, "is_causal", False))
    return Spec("attention", dims, ind, tuple(bd) + ("m", "j"), flops, _act_saves(c, [0, 1, 2]) + ("out",),
                extra={"causal": causal, "dropout_p": float(_arg(c, 4, "dropout_p", 0.0) or 0.0)})


def conv(c):
    x, w = c.ins[0], c.ins[1]
    out = c.out_shape
    nsp = len(out) - 2
    groups = int(_arg(c, 6, "groups", 1) if c.op != "convolution" else _arg(c, 8, "groups", 1))
    names = ["y", "x"] if nsp == 2 else [f"s{i}" for i in range(nsp)]
    N, O = out[0], out[1]
    C = x.shape[1]
    cname = "c" if groups == 1 else None
    dims = [("b0", int(N), True), ("o", int(O), True), ("c", int(C), groups == 1)] + \
        [(nm, int(s), False) for nm, s in zip(names, out[2:])]
    ind = [("b0", cname) + (None,) * nsp, ("o", cname) + (None,) * nsp]
    if len(c.ins) > 2:
        ind.append(("o",))
    flops = 2.0 * N * O * prod(out[2:]) * (C // groups) * prod(w.shape[2:])
    return Spec("conv", dims, ind, ("b0", "o") + tuple(names), flops, _act_saves(c, [0]),
                extra={"groups": groups, "kernel": tuple(int(s) for s in w.shape[2:])})


def embedding(c):
    w, ids = c.ins[0], c.ins[1]
    V, H = w.shape
    bd = [f"b{i}" for i in range(len(ids.shape))]
    dims = [(bd[i], int(s), True) for i, s in enumerate(ids.shape)] + [("v", int(V), True), ("h", int(H), True)]
    return Spec("embedding", dims, [("v", "h"), tuple(bd)], tuple(bd) + ("h",), 0.0, ("in1",),
                extra={"sparse": bool(_arg(c, 4, "sparse", False))})


# ---- normalisation, softmax, reductions, pooling ----------------------------------------------
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
    # Spatial axes stay whole; the batch axis may split (per-replica statistics, as DDP does).
    unsplit = set(range(2, len(r)))
    ind = [tuple(f"a{i}" for i in range(len(r)))] + [("a1",) for _ in c.ins[1:]]
    return Spec("norm", _adims(r, unsplit), ind, tuple(f"a{i}" for i in range(len(r))), 5.0 * prod(r),
                _act_saves(c, [0]))


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
    x = c.ins[0]
    n = len(x.shape)
    if c.op in ("sum", "mean") and len(c.args) < 2 and "dim" not in c.kwargs:
        red = set(range(n))
        keep = False
    else:
        d = _arg(c, 1, "dim", None)
        d = list(range(n)) if d is None else ([d] if isinstance(d, int) else list(d))
        red = {_axis(int(a), n) for a in d}
        keep = bool(_arg(c, 2, "keepdim", False))
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


# ---- views and data movement ---------------------------------------------------------------
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
    unsplit, also = set(), []
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
    s = _view_spec(c, [tuple(ind)] + [() for _ in c.ins[1:]], unsplit, also)
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
    """slice / narrow / split pieces: the cut axis stays whole unless the slice is the full axis."""
    x = c.ins[0]
    n = len(x.shape)
    r = c.out_shape
    d = _axis(int(_arg(c, 1, "dim", 0)), n)
    ind = tuple(f"a{i}" if (i != d or x.shape[i] == r[i]) else None for i in range(n))
    unsplit = set() if x.shape[d] == r[d] else {d}
    return _view_spec(c, [ind], unsplit)


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
    r = c.out_shape
    d = _axis(int(_arg(c, 1, "dim", 0)), len(r))
    ind = [tuple(f"a{i}" if (i != d and t.shape[i] == r[i]) else None for i in range(len(t.shape)))
           if len(t.shape) == len(r) else tuple(None for _ in t.shape) for t in c.ins]
    return _view_spec(c, ind, {d}, copies=True)


def creation(c):
    r = c.out_shape
    return Spec("other", _adims(r), [tuple(None for _ in t.shape) for t in c.ins],
                tuple(f"a{i}" for i in range(len(r))), 0.0, ())


def generic(c):
    """Unknown op: output axes a<i>; inputs of the output's shape map straight, others broadcast
    where sizes agree.  Only batch dims are splittable (set after batch propagation)."""
    r = c.out_shape
    return Spec("other", _adims(r), [_bcast(t.shape, r) for t in c.ins], tuple(f"a{i}" for i in range(len(r))),
                float(prod(r)), _act_saves(c, list(range(len(c.ins)))), generic=True)


HANDLERS = {
    "linear": linear, "addmm": addmm, "mm": matmul, "bmm": matmul, "matmul": matmul, "baddbmm": matmul,
    "scaled_dot_product_attention": sdpa, "_scaled_dot_product_flash_attention": sdpa,
    "_scaled_dot_product_efficient_attention": sdpa,
    "conv1d": conv, "conv2d": conv, "conv3d": conv, "convolution": conv,
    "embedding": embedding,
    "layer_norm": layer_norm, "native_layer_norm": layer_norm, "rms_norm": rms_norm,
    "batch_norm": batch_norm, "_native_batch_norm_legit_functional": batch_norm,
    "_native_batch_norm_legit": batch_norm, "native_batch_norm": batch_norm, "instance_norm": group_norm,
    "group_norm": group_norm, "native_group_norm": group_norm,
    "softmax": softmax, "_softmax": softmax, "log_softmax": softmax, "_log_softmax": softmax,
    "dropout": dropout, "native_dropout": dropout, "feature_dropout": dropout, "alpha_dropout": dropout,
    "sum": reduction, "mean": reduction, "amax": reduction, "amin": reduction, "max": reduction,
    "min": reduction, "prod": reduction, "logsumexp": reduction, "nansum": reduction, "var": reduction,
    "std": reduction, "norm": reduction,
    "max_pool1d": pool, "max_pool2d": pool, "max_pool3d": pool, "max_pool2d_with_indices": pool,
    "avg_pool1d": pool, "avg_pool2d": pool, "avg_pool3d": pool, "adaptive_avg_pool1d": pool,
    "adaptive_avg_pool2d": pool, "adaptive_avg_pool3d": pool, "_adaptive_avg_pool2d": pool,
    "adaptive_max_pool2d": pool,
    "cross_entropy_loss": cross_entropy, "nll_loss": cross_entropy, "nll_loss_nd": cross_entropy,
    "binary_cross_entropy_with_logits": pointwise_loss, "binary_cross_entropy": pointwise_loss,
    "mse_loss": pointwise_loss, "l1_loss": pointwise_loss, "smooth_l1_loss": pointwise_loss,
    "huber_loss": pointwise_loss,
    "view": reshape, "reshape": reshape, "_unsafe_view": reshape, "flatten": reshape, "unflatten": reshape,
    "squeeze": reshape, "unsqueeze": reshape, "view_as": reshape, "reshape_as": reshape,
    "permute": permute, "transpose": permute, "t": permute, "swapaxes": permute, "swapdims": permute,
    "expand": expand, "expand_as": expand, "repeat": expand, "broadcast_to": expand,
    "alias": identity, "detach": identity, "contiguous": identity, "clone": identity,
    "lift_fresh_copy": identity, "view_copy": reshape, "_to_copy": identity, "to": identity,
    "type_as": identity, "copy": identity,
    "slice": slice_, "narrow": slice_, "select": select, "cat": cat, "concat": cat, "concatenate": cat,
    "arange": creation, "zeros": creation, "ones": creation, "full": creation, "empty": creation,
    "zeros_like": creation, "ones_like": creation, "full_like": creation, "empty_like": creation,
    "new_ones": creation, "new_zeros": creation, "new_full": creation, "new_empty": creation,
    "scalar_tensor": creation, "tensor": creation, "rand": creation, "randn": creation,
    "rand_like": creation, "randn_like": creation, "randint": creation, "linspace": creation,
}
for _op in ELEMENTWISE:
    HANDLERS.setdefault(_op, elementwise)
HANDLERS["_to_copy"] = identity
HANDLERS["to"] = identity
HANDLERS["type_as"] = identity
HANDLERS["copy"] = identity
HANDLERS["scalar_tensor"] = creation


def spec_for(c: OpCall) -> Spec:
    return HANDLERS.get(c.op, generic)(c)
