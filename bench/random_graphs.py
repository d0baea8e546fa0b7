"""Hand-built operator graphs following the ir.py conventions: a GPT model (for tests and the speed
benchmark before/without capture) and random small DAGs (for the quality benchmark against the exact
solver).  Activations are recorded as float32 (what capture records); the cost model reprices them at
the settings' precision."""
from __future__ import annotations

import random

from sapp.capture.ir import DTYPE_BYTES, Dim, OpGraph, OpNode, Operand, ParamInfo, TensorSpec


class GraphBuilder:
    def __init__(self, name, dtype="float32"):
        self.name, self.dtype = name, dtype
        self.nodes, self.params, self.blocks = {}, {}, {}

    def add(self, name, kind, dims, operands, out_dims, *, saves=(), flops=None, block=None, module="",
            out_dtype=None):
        """dims: [(name, size, splittable, batch)]; operands: [("act", producer, axis dims) |
        ("param", qualname, axis dims) | ("ids", None, axis dims)]; shapes follow from dim sizes."""
        dd = tuple(Dim(*d) for d in dims)
        size = {d.name: d.size for d in dd}
        ops = []
        for tag, ref, odims in operands:
            shape = tuple(size[d] for d in odims)
            if tag == "act":
                ops.append(Operand(shape, self.nodes[ref].out.dtype, tuple(odims), producer=ref))
            elif tag == "param":
                ops.append(Operand(shape, self.dtype, tuple(odims), param=ref))
                self.params.setdefault(ref, ParamInfo(ref, shape, self.dtype, module or name))
            else:
                ops.append(Operand(shape, "int64", tuple(odims)))
        out = TensorSpec(tuple(size[d] for d in out_dims), out_dtype or self.dtype, tuple(out_dims))
        if flops is None:
            flops = float(out.numel)
        nbytes = float(sum(o.nbytes for o in ops) + out.nbytes)
        node = OpNode(name, kind, "hand." + kind, dd, tuple(ops), out, float(flops), nbytes, tuple(saves),
                      module or name, block)
        self.nodes[name] = node
        if block is not None:
            self.blocks.setdefault(block, []).append(name)
        return name

    def graph(self, outputs=(), batch=1, groups=None, meta=None):
        return OpGraph(self.name, dict(self.nodes), dict(self.params), tuple(outputs), batch,
                       dict(self.blocks), groups if groups is not None else [], dict(meta or {}))


def _prod(*xs):
    p = 1
    for x in xs:
        p *= x
    return p


def gpt_layer(g: GraphBuilder, x, i, b, s, h, a, prefix="layers"):
    """One pre-LN GPT layer reading activation `x` (b, s, h); returns the name of its output.  Saves
    follow Megatron's accounting (REFERENCE: s*b*h*(34 + 5*a*s/h) bytes in 16-bit)."""
    blk = f"{prefix}.{i}"
    n = lambda k: f"{blk}.{k}"
    d = h // a
    B = ("b0", b, True, True)
    S = ("b1", s, True, False)
    g.add(n("ln1"), "norm", [("a0", b, True, True), ("a1", s, True, False), ("a2", h, False, False)],
          [("act", x, ("a0", "a1", "a2")), ("param", n("ln1.weight"), ("a2",)), ("param", n("ln1.bias"), ("a2",))],
          ("a0", "a1", "a2"), saves=("in0",), flops=8 * b * s * h, block=blk)
    for proj in ("q", "k", "v"):
        g.add(n(proj), "matmul", [B, S, ("n0", a, True, False), ("n1", d, True, False), ("k", h, True, False)],
              [("act", n("ln1"), ("b0", "b1", "k")), ("param", n(f"{proj}.weight"), ("n0", "n1", "k")),
               ("param", n(f"{proj}.bias"), ("n0", "n1"))],
              ("b0", "b1", "n0", "n1"), saves=("in0",), flops=2 * b * s * h * h, block=blk)
    g.add(n("scores"), "matmul", [("b0", b, True, True), ("b1", a, True, False), ("m", s, True, False),
                                  ("n", s, True, False), ("k", d, True, False)],
          [("act", n("q"), ("b0", "m", "b1", "k")), ("act", n("k"), ("b0", "n", "b1", "k"))],
          ("b0", "b1", "m", "n"), saves=("in0", "in1"), flops=2 * b * a * s * s * d, block=blk)
    sm = [("a0", b, True, True), ("a1", a, True, False), ("a2", s, True, False), ("a3", s, False, False)]
    g.add(n("softmax"), "softmax", sm, [("act", n("scores"), ("a0", "a1", "a2", "a3"))],
          ("a0", "a1", "a2", "a3"), saves=("out",), flops=5 * b * a * s * s, block=blk)
    g.add(n("attn_drop"), "dropout", sm, [("act", n("softmax"), ("a0", "a1", "a2", "a3"))],
          ("a0", "a1", "a2", "a3"), saves=("mask",), flops=b * a * s * s, block=blk)
    g.add(n("context"), "matmul", [("b0", b, True, True), ("b1", a, True, False), ("m", s, True, False),
                                   ("n", d, True, False), ("k", s, True, False)],
          [("act", n("attn_drop"), ("b0", "b1", "m", "k")), ("act", n("v"), ("b0", "k", "b1", "n"))],
          ("b0", "m", "b1", "n"), saves=("in0", "in1"), flops=2 * b * a * s * s * d, block=blk)
    g.add(n("proj"), "matmul", [B, S, ("n", h, True, False), ("k0", a, True, False), ("k1", d, True, False)],
          [("act", n("context"), ("b0", "b1", "k0", "k1")), ("param", n("proj.weight"), ("n", "k0", "k1")),
           ("param", n("proj.bias"), ("n",))],
          ("b0", "b1", "n"), saves=("in0",), flops=2 * b * s * h * h, block=blk)
    e3 = [("a0", b, True, True), ("a1", s, True, False), ("a2", h, True, False)]
    ax = ("a0", "a1", "a2")
    g.add(n("drop1"), "dropout", e3, [("act", n("proj"), ax)], ax, saves=("mask",), block=blk)
    g.add(n("add1"), "elementwise", e3, [("act", x, ax), ("act", n("drop1"), ax)], ax, block=blk)
    g.add(n("ln2"), "norm", [("a0", b, True, True), ("a1", s, True, False), ("a2", h, False, False)],
          [("act", n("add1"), ax), ("param", n("ln2.weight"), ("a2",)), ("param", n("ln2.bias"), ("a2",))],
          ax, saves=("in0",), flops=8 * b * s * h, block=blk)
    g.add(n("fc1"), "matmul", [B, S, ("n", 4 * h, True, False), ("k", h, True, False)],
          [("act", n("ln2"), ("b0", "b1", "k")), ("param", n("fc1.weight"), ("n", "k")), ("param", n("fc1.bias"), ("n",))],
          ("b0", "b1", "n"), saves=("in0",), flops=8 * b * s * h * h, block=blk)
    e4 = [("a0", b, True, True), ("a1", s, True, False), ("a2", 4 * h, True, False)]
    g.add(n("gelu"), "elementwise", e4, [("act", n("fc1"), ax)], ax, saves=("in0",), flops=8 * b * s * 4 * h, block=blk)
    g.add(n("fc2"), "matmul", [B, S, ("n", h, True, False), ("k", 4 * h, True, False)],
          [("act", n("gelu"), ("b0", "b1", "k")), ("param", n("fc2.weight"), ("n", "k")), ("param", n("fc2.bias"), ("n",))],
          ("b0", "b1", "n"), saves=("in0",), flops=8 * b * s * h * h, block=blk)
    g.add(n("drop2"), "dropout", e3, [("act", n("fc2"), ax)], ax, saves=("mask",), block=blk)
    return g.add(n("add2"), "elementwise", e3, [("act", n("add1"), ax), ("act", n("drop2"), ax)], ax, block=blk)


def gpt_graph(layers=2, b=8, s=1024, h=1024, a=16, vocab=50304, name="gpt-hand", head=True):
    """A GPT model graph: ids -> embedding -> `layers` layers (one block group) -> final norm ->
    LM head -> loss.  `head=False` keeps only the layers, reading a float input."""
    g = GraphBuilder(name)
    ax = ("a0", "a1", "a2")
    e3 = [("a0", b, True, True), ("a1", s, True, False), ("a2", h, True, False)]
    if head:
        g.add("ids", "input", [("a0", b, True, True), ("a1", s, True, False)], [("ids", None, ("a0", "a1"))],
              ("a0", "a1"), flops=0, out_dtype="int64")
        x = g.add("embed", "embedding", [("b0", b, True, True), ("b1", s, True, False), ("v", vocab, True, False),
                                         ("h", h, True, False)],
                  [("act", "ids", ("b0", "b1")), ("param", "embed.weight", ("v", "h"))], ("b0", "b1", "h"),
                  flops=0)
    else:
        x = g.add("x", "input", e3, [], ax, flops=0)
    for i in range(layers):
        x = gpt_layer(g, x, i, b, s, h, a)
    if head:
        g.add("ln_f", "norm", [("a0", b, True, True), ("a1", s, True, False), ("a2", h, False, False)],
              [("act", x, ax), ("param", "ln_f.weight", ("a2",)), ("param", "ln_f.bias", ("a2",))], ax,
              saves=("in0",), flops=8 * b * s * h)
        g.add("lm_head", "matmul", [("b0", b, True, True), ("b1", s, True, False), ("n", vocab, True, False),
                                    ("k", h, True, False)],
              [("act", "ln_f", ("b0", "b1", "k")), ("param", "lm_head.weight", ("n", "k"))], ("b0", "b1", "n"),
              saves=("in0",), flops=2 * b * s * h * vocab)
        x = g.add("loss", "loss", [("b0", b, True, True), ("b1", s, True, False), ("v", vocab, False, False)],
                  [("act", "lm_head", ("b0", "b1", "v")), ("ids", None, ("b0", "b1"))], (), saves=("in0",),
                  flops=4 * b * s * vocab)
    groups = [[f"layers.{i}" for i in range(layers)]] if layers > 1 else []
    return g.graph(outputs=(x,), batch=b, groups=groups,
                   meta={"seq_len": s, "hidden": h, "heads": a, "layers": layers, "vocab": vocab})


def mlp_graph(b=8, s=128, h=1024, name="mlp-hand"):
    """x -> fc1 -> gelu -> fc2 -> out: the Megatron MLP test case."""
    g = GraphBuilder(name)
    ax = ("a0", "a1", "a2")
    g.add("x", "input", [("a0", b, True, True), ("a1", s, True, False), ("a2", h, True, False)], [], ax, flops=0)
    g.add("fc1", "matmul", [("b0", b, True, True), ("b1", s, True, False), ("n", 4 * h, True, False), ("k", h, True, False)],
          [("act", "x", ("b0", "b1", "k")), ("param", "fc1.weight", ("n", "k"))], ("b0", "b1", "n"),
          saves=("in0",), flops=8 * b * s * h * h)
    g.add("gelu", "elementwise", [("a0", b, True, True), ("a1", s, True, False), ("a2", 4 * h, True, False)],
          [("act", "fc1", ax)], ax, saves=("in0",))
    g.add("fc2", "matmul", [("b0", b, True, True), ("b1", s, True, False), ("n", h, True, False), ("k", 4 * h, True, False)],
          [("act", "gelu", ("b0", "b1", "k")), ("param", "fc2.weight", ("n", "k"))], ("b0", "b1", "n"),
          saves=("in0",), flops=8 * b * s * h * h)
    g.add("out", "elementwise", [("a0", b, True, True), ("a1", s, True, False), ("a2", h, True, False)],
          [("act", "fc2", ax)], ax)
    return g.graph(outputs=("out",), batch=b)


def random_graph(seed: int, n_nodes: int = 6, scale: str | None = None) -> OpGraph:
    """A random DAG of `n_nodes` ops over (B, S, X) activations: linear (with weight), element-wise
    unary/binary, softmax / norm (last axis unsplittable), attention-style bmm pairs, an optional
    embedding front.  Sizes are multiples of 2 and 3 so 4/6/8/16-device meshes have choices."""
    rng = random.Random(seed)
    scale = scale or rng.choice(["small", "mid", "large"])
    B = rng.choice([6, 12, 24]) if scale != "small" else rng.choice([6, 12])
    S = {"small": rng.choice([12, 48]), "mid": rng.choice([96, 384]), "large": rng.choice([384, 1536])}[scale]
    widths = {"small": [24, 48, 96], "mid": [192, 384, 768], "large": [1536, 3072, 6144]}[scale]
    g = GraphBuilder(f"random-{seed}")
    ax = ("a0", "a1", "a2")
    tensors = []   # (name, width)

    def e3(w, last_split=True):
        return [("a0", B, True, True), ("a1", S, True, False), ("a2", w, last_split, False)]

    if rng.random() < 0.3:
        g.add("ids", "input", [("a0", B, True, True), ("a1", S, True, False)], [("ids", None, ("a0", "a1"))],
              ("a0", "a1"), flops=0, out_dtype="int64")
        w = rng.choice(widths)
        vocab = rng.choice([768, 3072, 12288])
        g.add("n0", "embedding", [("b0", B, True, True), ("b1", S, True, False), ("v", vocab, True, False),
                                  ("h", w, True, False)],
              [("act", "ids", ("b0", "b1")), ("param", "emb.weight", ("v", "h"))], ("b0", "b1", "h"), flops=0)
    else:
        w = rng.choice(widths)
        g.add("n0", "input", e3(w), [], ax, flops=0)
    tensors.append(("n0", w))
    i = 1
    while len(g.nodes) < n_nodes + (1 if "ids" in g.nodes else 0):
        name = f"n{i}"
        i += 1
        src, w = rng.choice(tensors[-3:])
        r = rng.random()
        if r < 0.4:
            n_out = rng.choice(widths)
            g.add(name, "matmul", [("b0", B, True, True), ("b1", S, True, False), ("n", n_out, True, False),
                                   ("k", w, True, False)],
                  [("act", src, ("b0", "b1", "k")), ("param", f"{name}.weight", ("n", "k"))], ("b0", "b1", "n"),
                  saves=("in0",), flops=2 * B * S * w * n_out)
            tensors.append((name, n_out))
        elif r < 0.55:
            same = [t for t in tensors if t[1] == w and t[0] != src]
            if same:
                other = rng.choice(same)[0]
                g.add(name, "elementwise", e3(w), [("act", src, ax), ("act", other, ax)], ax)
            else:
                g.add(name, "elementwise", e3(w), [("act", src, ax)], ax, saves=("in0",), flops=4 * B * S * w)
            tensors.append((name, w))
        elif r < 0.75:
            kind = rng.choice(["softmax", "norm"])
            params = [("param", f"{name}.weight", ("a2",))] if kind == "norm" else []
            g.add(name, kind, e3(w, False), [("act", src, ax)] + params, ax,
                  saves=("out",) if kind == "softmax" else ("in0",), flops=5 * B * S * w)
            tensors.append((name, w))
        else:
            same = [t for t in tensors if t[1] == w and t[0] != src]
            other = rng.choice(same)[0] if same else src
            # scores[b, m, n] = sum_k src[b, m, k] * other[b, n, k]  -> width S
            g.add(name, "matmul", [("b0", B, True, True), ("m", S, True, False), ("n", S, True, False),
                                   ("k", w, True, False)],
                  [("act", src, ("b0", "m", "k")), ("act", other, ("b0", "n", "k"))], ("b0", "m", "n"),
                  saves=("in0", "in1"), flops=2 * B * S * S * w)
            tensors.append((name, S))
    last = list(g.nodes)[-1]
    return g.graph(outputs=(last,), batch=B, meta={"scale": scale})


__all__ = ["GraphBuilder", "gpt_layer", "gpt_graph", "mlp_graph", "random_graph", "DTYPE_BYTES"]
