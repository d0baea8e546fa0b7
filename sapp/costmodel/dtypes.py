"""Bytes per element of every activation as `torch.autocast(dtype=bfloat16)` really runs the model.
Pure Python: no torch here.

Under autocast an op's output dtype follows three rules (torch.amp "autocast op reference"):
  - matmul-like ops (mm/bmm/linear/conv/attention...) cast their float inputs to bf16: output 2 B;
  - the fp32 list (softmax, log_softmax, layer_norm, group_norm, losses, sum, exp, pow, ...) casts
    its float inputs to fp32: output 4 B;
  - everything else runs in the widest float dtype of its inputs (type promotion), parameters
    included: the model's weights stay fp32, so an embedding lookup is 4 B and 4 B spreads through
    element-wise ops until a matmul-like op brings it back to 2 B.
Casting an input is a separate copy: a matmul saves the bf16 copy of an fp32 input for backward,
not the input itself.

The propagated widths of a graph are stamped on its nodes (`node.extra[WIDTHS_KEY]`, settings
independent) the first time the graph is priced; `OpGraph.rebatch` / `subgraph` copy them, so a
sub-graph keeps the widths its nodes had in the whole model.  A node never seen inside a graph is
priced as if its activation inputs were half width.
"""
from __future__ import annotations

from sapp.capture.ir import DTYPE_BYTES
from .fusion import ALIAS_KEY

HALF, FULL = 2, 4
WIDTHS_KEY = "autocast_widths"      # (out width, per-operand width as it arrives, width the op computes on)
_FLOATS = ("float32", "float16", "bfloat16")     # float64 is not autocast-eligible: it keeps 8 B

# Ops autocast runs in bf16 (by base name of the aten target), per device.
_LOWER = frozenset((
    "mm", "bmm", "matmul", "addmm", "addmv", "addr", "baddbmm", "addbmm", "linear", "mv", "einsum",
    "chain_matmul", "linalg_multi_dot", "linalg_vecdot", "conv1d", "conv2d", "conv3d", "convolution",
    "_convolution", "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "prelu",
    "scaled_dot_product_attention", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
))
_LOSSES = frozenset((
    "cross_entropy_loss", "nll_loss", "nll_loss2d", "nll_loss_nd", "mse_loss", "l1_loss", "smooth_l1_loss",
    "huber_loss", "kl_div", "poisson_nll_loss", "cosine_embedding_loss", "hinge_embedding_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "cdist",
))
# CUDA runs these in fp32 (softmax & co. through their optional dtype argument set to float32).
_FP32_CUDA = _LOSSES | frozenset((
    "softmax", "log_softmax", "softmin", "layer_norm", "native_layer_norm", "group_norm", "native_group_norm",
    "acos", "asin", "cosh", "sinh", "tan", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "pow", "softplus", "sum", "prod", "cumsum", "cumprod", "logsumexp", "norm",
    "linalg_vector_norm", "linalg_matrix_norm", "frobenius_norm", "nuclear_norm", "cosine_similarity",
    "dist", "pdist", "renorm",
))
# CPU autocast keeps softmax / layer_norm / exp / sum in their input dtype; its fp32 list is mostly losses.
_FP32_CPU = _LOSSES | frozenset(("prod", "avg_pool3d", "adaptive_avg_pool3d", "max_pool3d", "trace"))
_TABLES = {"cuda": (_LOWER, _FP32_CUDA, ("softmax", "loss")), "cpu": (_LOWER, _FP32_CPU, ("loss",))}
# An explicit dtype conversion keeps the dtype the model asked for (the captured one).
_EXPLICIT = frozenset(("to", "_to_copy", "type_as", "float", "double", "half", "bfloat16", "full", "ones",
                       "zeros", "empty", "arange", "rand", "randn", "tensor", "scalar_tensor"))
_HALF_KINDS = ("matmul", "conv", "attention")


def op_name(target: str) -> str:
    """"aten.softmax.int" -> "softmax", "aten.split.Tensor[0]" -> "split", "softmax" -> "softmax"."""
    parts = target.split("[")[0].split(".")
    if len(parts) >= 2 and parts[0] in ("aten", "prims", "torch", "nn", "functional"):
        return parts[1]
    return parts[0]


def _width(dtype: str) -> int:
    return DTYPE_BYTES.get(dtype, 4)


def node_widths(node, known, device: str = "cuda") -> tuple:
    """(out width, arriving width per operand, computed-on width per operand) of one op under
    autocast.  `known` maps producer names to their output widths; a producer missing from it
    (a node priced on its own) is taken at half width."""
    lower, fp32, fp32_kinds = _TABLES[device]
    name = op_name(node.target)
    arrive = []
    for o in node.operands:
        if o.dtype not in _FLOATS:
            arrive.append(_width(o.dtype))
        elif o.param is not None or o.producer is None:
            arrive.append(_width(o.dtype))           # weights / graph inputs: as the model holds them
        else:
            arrive.append(known.get(o.producer, HALF))
    if node.kind == "input" or node.out.dtype not in _FLOATS:
        mode = "own"
    elif node.kind in _HALF_KINDS or name in lower:
        mode = HALF
    elif node.kind in fp32_kinds or name in fp32:
        mode = FULL
    elif name in _EXPLICIT:
        mode = "own"
    elif node.kind == "embedding":
        mode = "weight"
    elif node.kind == "norm":
        mode = "input"            # batch_norm & co.: output in the input's dtype, fp32 weights or not
    else:
        mode = "promote"
    compute = list(arrive)
    if mode in (HALF, FULL):
        compute = [mode if o.dtype in _FLOATS else a for o, a in zip(node.operands, arrive)]
        out = mode
    elif mode == "own":
        out = _width(node.out.dtype)
    else:
        if mode == "weight":
            cand = [a for o, a in zip(node.operands, arrive) if o.param is not None and o.dtype in _FLOATS]
        elif mode == "input":
            cand = [a for o, a in zip(node.operands, arrive) if o.param is None and o.dtype in _FLOATS][:1]
        else:
            # type promotion: dimensioned tensors decide; 0-dim ones only when nothing else is a float
            fl = [(o, a) for o, a in zip(node.operands, arrive) if o.dtype in _FLOATS
                  and (o.producer is not None or o.param is not None)]
            cand = [a for o, a in fl if len(o.shape) > 0] or [a for _, a in fl]
        out = max(cand) if cand else _width(node.out.dtype)
    return out, tuple(arrive), tuple(compute)


def propagate(graph, device: str = "cuda") -> dict:
    """name -> node_widths(...) for every node, in topological order.  Nodes that already carry
    widths (copied from the graph they were cut from) keep them."""
    known, res = {}, {}
    stamped = device == "cuda"
    for node in graph.nodes.values():
        w = node.extra.get(WIDTHS_KEY) if stamped else None
        if w is None or len(w[1]) != len(node.operands):
            w = node_widths(node, known, device)
        res[node.name] = w
        known[node.name] = w[0]
    return res


_STAMPED: dict = {}      # id(graph) -> graph (held, so the id cannot be reused while cached)


def ensure_widths(graph) -> None:
    """Stamp the autocast widths on the graph's nodes (once per graph object), and with them the
    kernel-fusion marks of the "fused" runtime (costmodel.fusion), the FP8 linears sharing each
    linear's input (costmodel.fp8_linears.fp8_shares) and the gradient flags
    (costmodel.grads): a node that already carries them (copied from the whole model into a
    sub-graph) keeps them."""
    if _STAMPED.get(id(graph)) is graph:
        return
    from .fp8_linears import fp8_shares
    from .fusion import fused_aliases, fusion_marks
    from .grads import stamp
    stamp(graph)            # which outputs carry a gradient (costmodel.grads)
    marks = aliases = None
    for name, w in propagate(graph).items():
        extra = graph.nodes[name].extra
        if len(w) < 5:
            if marks is None:
                marks, aliases, shares = fusion_marks(graph), fused_aliases(graph), fp8_shares(graph)
            # (and the FP8 linears reading the same input: one cast under compile, costmodel/fp8.py)
            w = tuple(w[:3]) + (marks[name], shares.get(name, 1))
            if name in aliases:
                extra[ALIAS_KEY] = aliases[name]
            else:
                extra.pop(ALIAS_KEY, None)
        extra[WIDTHS_KEY] = w
    if len(_STAMPED) >= 64:
        _STAMPED.clear()
    _STAMPED[id(graph)] = graph


def _stamp(node):
    w = node.extra.get(WIDTHS_KEY)
    if w is None or len(w[1]) != len(node.operands):
        w = node_widths(node, {})
    return w


def fp8_share_of(node) -> int:
    """The FP8 linears reading this linear's input, as ensure_widths stamped them (costmodel.fp8_linears);
    1 for a node never seen inside a graph."""
    w = node.extra.get(WIDTHS_KEY)
    return int(w[4]) if w is not None and len(w) > 4 else 1


NO_FUSION = ((), False, ())


def fusion_of(node) -> tuple:
    """(operand indices read inside a fused kernel, output kept inside it, operand indices the kernel
    recomputes in backward rather than keeping) as stamped by ensure_widths (costmodel.fusion); no
    fusion for a node never seen inside a graph."""
    w = node.extra.get(WIDTHS_KEY)
    m = w[3] if w is not None and len(w) > 3 and len(w[1]) == len(node.operands) else NO_FUSION
    return tuple(m) + ((),) * (3 - len(m))


def fused_alias(node, i):
    """(tensor id, elements) the "fused" runtime keeps operand i of `node` as, or None
    (costmodel.fusion.fused_aliases)."""
    for j, tid, numel in node.extra.get(ALIAS_KEY, ()):
        if j == i:
            return tid, numel
    return None


def out_bytes(node, settings) -> int:
    """Bytes per element of the node's output under `settings`."""
    if not settings.autocast or node.out.dtype not in _FLOATS:
        return settings.act_bytes(node.out.dtype)
    return _stamp(node)[0]


def operand_bytes(node, i, settings) -> tuple:
    """(arriving, computed-on) bytes per element of operand i: they differ where autocast casts it
    (a separate copy).  Parameters report their held width; the cost model prices them separately."""
    o = node.operands[i]
    if settings.loss_fp32 and node.kind == "loss" and o.dtype in _FLOATS and o.param is None:
        # the fused runtime (Megatron-Core) computes the loss in fp32: its vocab-parallel cross entropy
        # casts the half-precision logits to fp32 first and keeps the fp32 softmax for backward
        # (megatron/core/tensor_parallel/cross_entropy.py, unless --cross-entropy-loss-fusion); torchtitan's
        # cross_entropy_loss on `pred.flatten(0, 1).float()` likewise
        return settings.act_bytes(o.dtype), FULL
    if not settings.autocast or o.dtype not in _FLOATS:
        b = settings.act_bytes(o.dtype)
        return b, b
    w = _stamp(node)
    return w[1][i], w[2][i]


def activation_widths(graph, settings, device: str = "cuda") -> dict:
    """node name -> bytes per element of its output under `settings`: fp32 -> 4 for floats; bf16-mixed
    with `autocast_fp32` -> what autocast on `device` runs; bf16-mixed without -> 2 for floats.
    Integer tensors keep their own width."""
    if not settings.autocast:
        return {n.name: settings.act_bytes(n.out.dtype) for n in graph.nodes.values()}
    if device != "cuda":
        return {k: v[0] for k, v in propagate(graph, device).items()}
    ensure_widths(graph)
    return {n.name: n.extra[WIDTHS_KEY][0] for n in graph.nodes.values()}
