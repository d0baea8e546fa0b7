"""Contractions: linear / addmm / matmul / bmm, attention, convolution, embedding lookups.  FLOPs 2
per multiply-add (bias adds not counted, as torch.utils.flop_counter)."""
from __future__ import annotations

from .opspec import Spec, _act_saves, _arg, _bias_dims, generic, prod

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
    # Grouped-query attention (enable_gqa): K and V carry fewer heads than q, query head i using
    # key/value head i // (heads / kv_heads).  The head dim then takes the key/value head count as
    # its size: a split must divide it (a shard holds whole KV heads with the query heads that use
    # them), and q / out shard their heads by the same factor.
    gqa = {}
    if len(k.shape) == len(q.shape):
        for j in range(len(lead)):
            kh, qh = int(k.shape[j]), int(lead[j])
            if 1 < kh < qh and qh % kh == 0 and int(q.shape[j]) == qh:
                gqa[j] = kh
    # The key/value sequence and head dims stay whole: splitting them needs ring/flash-decoding
    # style kernels that emit does not produce.
    dims = [(bd[i], int(gqa.get(i, s)), True) for i, s in enumerate(lead)] + [
        ("m", int(L), True), ("n", int(S), False), ("k", int(E), False), ("j", int(Ev), False)]

    def lead_map(shape):
        nl = len(shape) - 2
        out = []
        for j in range(nl):
            i = len(lead) - nl + j
            ok = 0 <= i and shape[j] != 1 and (shape[j] == lead[i] or shape[j] == gqa.get(i))
            out.append(bd[i] if ok else None)
        return tuple(out)
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
                extra={"causal": causal, "dropout_p": float(_arg(c, 4, "dropout_p", 0.0) or 0.0),
                       **({"gqa": True} if gqa else {})},
                trusted=bool(gqa))      # q / out heads link to the smaller KV-head dim on purpose


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




def conv_transpose(c):
    """Transposed convolution x[N,C,*] · w[C,O/g,*k] -> [N,O,*]: every input element scatters a
    kernel's worth of multiply-adds (2·N·C·(O/g)·prod(in spatial)·prod(kernel)), as flop_counter."""
    x, w = c.ins[0], c.ins[1]
    out = c.out_shape
    nsp = len(out) - 2
    groups = int(_arg(c, 6, "groups", 1)) if c.op != "convolution" else int(_arg(c, 8, "groups", 1))
    names = ["y", "x"] if nsp == 2 else [f"s{i}" for i in range(nsp)]
    N, O, C = out[0], out[1], x.shape[1]
    cname = "c" if groups == 1 else None
    dims = [("b0", int(N), True), ("o", int(O), groups == 1), ("c", int(C), groups == 1)] + \
        [(nm, int(s), False) for nm, s in zip(names, out[2:])]
    ind = [("b0", cname) + (None,) * nsp, (cname, "o" if groups == 1 else None) + (None,) * nsp]
    if len(c.ins) > 2:
        ind.append(("o",))
    flops = 2.0 * N * C * (O // groups) * prod(x.shape[2:]) * prod(w.shape[2:])
    return Spec("conv", dims, ind, ("b0", "o") + tuple(names), flops, _act_saves(c, [0]),
                extra={"groups": groups, "kernel": tuple(int(s) for s in w.shape[2:]), "transposed": True})


def convolution(c):
    """aten.convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups)."""
    return conv_transpose(c) if bool(_arg(c, 6, "transposed", False)) else conv(c)


def embedding_bag(c):
    """Bags of rows summed / averaged / maxed: ids [B, L] (or flat ids + offsets) -> [B, H].  One
    add per row read; the table splits like an embedding's (vocabulary: Partial out; width: sharded)."""
    w, ids = c.ins[0], c.ins[1]
    V, H = w.shape
    B = c.out_shape[0]
    dims = [("b0", int(B), True), ("v", int(V), True), ("h", int(H), True)]
    ind = [("v", "h"), ("b0", None) if len(ids.shape) == 2 and ids.shape[0] == B else (None,) * len(ids.shape)]
    ind += [(None,) * len(t.shape) for t in c.ins[2:]]
    return Spec("embedding", dims, ind, ("b0", "h"), float(prod(ids.shape) * H), ("in1",),
                extra={"sparse": bool(_arg(c, 4, "sparse", False)), "bag": True})


def grouped_mm(c):
    """Grouped (expert) GEMM: rows x[R, k] sorted by expert, weights w[E, k, n], group ends offs[E]
    -> out[R, n]; every row meets exactly one expert's matrix, so FLOPs are 2·R·k·n (R = tokens ×
    top-k), not E times that.  Dims: b0 the routed rows (batch-like: split with the data), n, k as a
    linear's, e the experts.  Only b0 splits for now: splitting e is expert parallelism (an all-to-all
    of the rows, its own issue) and splitting n / k is expert tensor parallelism, which needs DTensor
    layouts for [E, k, n] parameters that emit does not produce - so tensor-parallel ranks hold every
    expert whole, as the emitted program runs them.  Weights given as [E, n, k] map the same way."""
    x, w = c.ins[0], c.ins[1]
    R, k = x.shape[-2], x.shape[-1]
    n = c.out_shape[-1]
    E = w.shape[0] if len(w.shape) == 3 else 1
    if len(x.shape) != 2 or len(w.shape) != 3 or k not in w.shape[1:] or n not in w.shape[1:]:
        return generic(c)
    wd = ("e", "k", "n") if (w.shape[1] == k and w.shape[2] == n) else ("e", "n", "k")
    dims = [("b0", int(R), True), ("n", int(n), False), ("k", int(k), False), ("e", int(E), False)]
    ind = [("b0", "k"), wd] + [(None,) * len(t.shape) for t in c.ins[2:]]
    return Spec("matmul", dims, ind, ("b0", "n"), 2.0 * R * k * n, _act_saves(c, [0, 1]),
                extra={"experts": int(E), "rows_per_expert": R / max(E, 1)})


def einsum(c):
    """einsum(equation, operands): output letters are the dims a<i> of their output axis, summed
    letters `k`, `k1`, ... (splittable: partial sums, like a linear's k).  With two or more operands
    and a summed letter it is a contraction: 2 FLOPs per point of the whole letter space (as matmul's
    2*m*n*k); with one operand a sum (1 per point) or, without summed letters, a permuted view."""
    eq = str(_arg(c, 0, "equation")).replace(" ", "")
    lhs, rhs = eq.split("->") if "->" in eq else (eq, None)
    terms = lhs.split(",")
    if len(terms) != len(c.ins):
        return generic(c)
    ell = max((len(t.shape) - len(term) + 3 for term, t in zip(terms, c.ins) if "..." in term), default=0)
    fill = "".join(str(i) for i in range(ell))        # ellipsis axes: digits, never einsum letters
    terms = [term.replace("...", fill[ell - (len(t.shape) - len(term) + 3):]) for term, t in zip(terms, c.ins)]
    if rhs is None:
        once = sorted(x for x in set("".join(terms)) if x.isalpha() and "".join(terms).count(x) == 1)
        rhs = fill + "".join(once)
    rhs = rhs.replace("...", fill)
    if any(len(term) != len(t.shape) for term, t in zip(terms, c.ins)) or len(rhs) != len(c.out_shape):
        return generic(c)
    size = {}
    for term, t in zip(terms, c.ins):
        for x, s in zip(term, t.shape):
            size[x] = max(size.get(x, 1), int(s))
    summed = [x for x in dict.fromkeys("".join(terms)) if x not in rhs]
    name = {x: f"a{i}" for i, x in enumerate(rhs)}
    name.update({x: "k" if i == 0 else f"k{i}" for i, x in enumerate(summed)})
    dims = [(name[x], int(c.out_shape[i]), True) for i, x in enumerate(rhs)]
    dims += [(name[x], size[x], True) for x in summed]
    ind = [tuple(name[x] if int(s) == size[x] and (s != 1 or size[x] == 1) else None for x, s in zip(term, t.shape))
           for term, t in zip(terms, c.ins)]
    space = float(prod(size[x] for x in dict.fromkeys("".join(terms) + rhs)))
    if len(c.ins) >= 2 and summed:
        return Spec("matmul", dims, ind, tuple(name[x] for x in rhs), 2.0 * space, _act_saves(c, range(len(c.ins))))
    if summed:
        return Spec("reduction", dims, ind, tuple(name[x] for x in rhs), space, ())
    if len(c.ins) == 1:
        return Spec("view", dims, ind, tuple(name[x] for x in rhs), 0.0, (), copies=False)
    return Spec("elementwise", dims, ind, tuple(name[x] for x in rhs), space, _act_saves(c, range(len(c.ins))))


def fft(c):
    """fft_* (FNet's token mixing): a dense transform over the axes in `dim` (all of them for the
    n-dimensional variants without `dim`, the last for the 1-D ones), kept whole; the other axes map
    straight.  5 N log2 N FLOPs per transform of N points (Cooley-Tukey's count), i.e. 5 log2 N per
    output element."""
    import math
    x = c.ins[0]
    n, r = len(x.shape), c.out_shape
    dim = _arg(c, 2, "dim", None)
    if dim is None:
        axes = set(range(n)) if c.op.endswith(("fftn", "fft2")) else {n - 1}
        if c.op.endswith("fft2"):
            axes = {n - 2, n - 1}
    else:
        axes = {(int(a) + n) % n for a in ([dim] if isinstance(dim, int) else dim)}
    if len(r) != n:
        return generic(c)
    points = prod(max(int(x.shape[a]), int(r[a])) for a in axes)
    dims = [(f"a{i}", int(s), i not in axes) for i, s in enumerate(r)]
    ind = [tuple(None if i in axes else f"a{i}" for i in range(n))]
    return Spec("other", dims, ind, tuple(f"a{i}" for i in range(n)),
                5.0 * prod(r) * math.log2(max(points, 2)), ())
