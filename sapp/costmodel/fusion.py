"""Kernel fusion of the "fused" runtime profile (CostSettings.runtime, sapp/costmodel/settings.py
on runtime profiles).  Pure Python: no torch here.

Megatron-Core (and torch.compile) runs chains of point-wise ops as one kernel: scale + mask + softmax
(fused softmax), bias + dropout + residual add, bias + GeLU, the rotary multiply-adds.  Inside such a
chain an intermediate tensor is never written to memory nor read back, and the chain costs one launch.
This module finds those chains from the graph alone (no per-model list): a producer -> consumer edge is
fused when
  - the producer is point-wise (element-wise or dropout) and the consumer point-wise or a softmax
    (softmax kernels take a point-wise prologue: Megatron's scale-mask-softmax),
  - the producer's output (through views only) has that one consumer and the same element count (a
    broadcast or reduction changes the loop and ends the chain),
  - the tensor is not kept for backward (a saved tensor must be written anyway), except where the
    kernel recomputes it in backward: a point-wise consumer keeping the output of an element-wise
    producer that keeps every activation it reads itself.  Megatron-Core's bias-SwiGLU is the case:
    silu(gate) * up keeps silu(gate) for up's gradient, but the fused kernel (fusions/fused_bias_swiglu.py)
    saves only its input [gate | up] and recomputes silu in backward, as torch.compile's partitioner
    does with a point-wise chain; such an operand is neither written nor kept (memory.saved_items).
A fused edge removes the producer's output write and the consumer's operand read from both passes, and
the producer launches no kernel of its own.

Three more savings of Megatron-Core's kernels, found from the graph and priced under "fused" only
(tests/test_fused_saves.py; bench/megatron_saved_activations.py measures the layer they come from):
  - routing weights applied inside the activation: an MoE scales each expert output row by its routing
    weight; Megatron-Core applies that weight inside the bias-SwiGLU kernel (weighted_bias_swiglu) before
    the down projection, which is linear, so the scaled rows are the same and the weight's gradient is
    recomputed from the kernel's kept input.  A row-scale multiply of a weighted matmul's output (through
    views and row gathers) whose input comes from a recomputable element-wise op keeps no copy of the
    expert outputs (the third mark);
  - grouped-query attention: flash attention reads k and v with their kv heads; the expand + reshape
    copy an eager model makes to give every query head its own k, v is kept at the kv heads' size, as the
    tensor it was expanded from (`fused_aliases`).  Megatron-Core's v is a view of its fused q/k/v
    projection; where rotary embeddings made q and k new tensors, that view keeps the whole projection
    for backward, and v is priced so;
  - the attention output: flash attention in Megatron-Core returns the [s, b, h] layout the output
    projection reads, so a transposed copy of a kept attention output is that output, not a second tensor
    (`fused_aliases`).
The marks are settings-independent and stamped once per graph beside the autocast widths
(costmodel.dtypes.ensure_widths), so sub-graphs keep them; the aliases name tensors, so they are stamped
apart from the widths (ALIAS_KEY), out of the signatures that let repeated blocks share a price."""
from __future__ import annotations

POINTWISE = ("elementwise", "dropout")
ABSORBS = POINTWISE + ("softmax",)
ALIAS_KEY = "fused_aliases"         # node.extra: ((operand index, tensor id, elements), ...)
_GATHER = ("aten.index.Tensor", "aten.index_select.default")


def _saved_by(node, i) -> bool:
    return f"in{i}" in node.saves


def _recomputable(node) -> bool:
    """An element-wise op whose output backward can recompute from what it keeps for itself: it keeps
    every activation operand it reads (silu keeps its input), and not its output."""
    if node.kind != "elementwise" or "out" in node.saves:
        return False
    acts = [i for i, o in enumerate(node.operands) if o.param is None and o.producer is not None]
    return bool(acts) and all(_saved_by(node, i) for i in acts)


def fusion_marks(graph) -> dict:
    """name -> (operand indices read inside a fused kernel, output stays in the kernel, operand indices
    the fused kernel recomputes in backward instead of keeping them)."""
    consumers = graph.consumers()
    nodes = graph.nodes

    def through_views(name):
        """The single non-view consumer (name, operand index) reached through single-consumer views."""
        seen = 0
        while seen < 16:
            cs = consumers.get(name, [])
            if len(cs) != 1:
                return None
            c, i = cs[0]
            if nodes[c].kind != "view":
                return c, i
            name, seen = c, seen + 1
        return None

    def root(node, i):
        """The producer of operand i, looking back through single-consumer views."""
        o = node.operands[i]
        p = o.producer
        for _ in range(16):
            if p is None or nodes[p].kind != "view":
                return p
            vp = nodes[p]
            if len(consumers.get(p, [])) != 1 or not vp.operands:
                return None
            p = vp.operands[0].producer
        return None

    fused_in = {n: set() for n in nodes}
    again = {n: set() for n in nodes}
    fused_out = set()
    for node in nodes.values():
        if node.kind not in POINTWISE or "out" in node.saves:
            continue
        tgt = through_views(node.name)
        if tgt is None:
            continue
        c, i = tgt
        cn = nodes[c]
        recompute = _saved_by(cn, i) and cn.kind in POINTWISE and _recomputable(node)
        if cn.kind not in ABSORBS or (_saved_by(cn, i) and not recompute):
            continue
        if root(cn, i) != node.name or cn.operands[i].numel != node.out.numel or cn.out.numel != node.out.numel:
            continue
        fused_out.add(node.name)
        fused_in[c].add(i)
        if recompute:
            again[c].add(i)
    for node in nodes.values():
        i = _routed_rows(node, nodes, consumers)
        if i is not None:
            again[node.name].add(i)
    return {n: (tuple(sorted(fused_in[n])), n in fused_out, tuple(sorted(again[n]))) for n in nodes}


def _acts(node):
    return [i for i, o in enumerate(node.operands) if o.param is None and o.producer is not None]


def _same_view(node) -> bool:
    """A view that keeps its one activation operand's elements and width (a transpose, reshape, view;
    not a slice, expand, concatenation or dtype cast)."""
    acts = _acts(node)
    return (node.kind == "view" and len(acts) == 1 and node.operands[acts[0]].numel == node.out.numel
            and node.operands[acts[0]].dtype == node.out.dtype and "expand" not in node.target
            and ".to." not in node.target and "cat" not in node.target)


def _back(nodes, name, through):
    """Follow a chain of producers back from `name` while `through(node)` holds: the first node it
    does not hold for (None past 32 steps or at a graph input)."""
    for _ in range(32):
        if name is None or name not in nodes:
            return None
        node = nodes[name]
        if not through(node):
            return node
        acts = _acts(node)
        name = node.operands[acts[0]].producer if acts else None
    return None


def _routed_rows(node, nodes, consumers):
    """The operand index of the expert outputs in a routing-weight multiply that Megatron-Core's kernel
    does not keep (module docstring), else None."""
    if node.kind != "elementwise" or "mul" not in node.target:
        return None
    acts = _acts(node)
    if len(acts) != 2:
        return None
    big, small = sorted(acts, key=lambda i: -node.operands[i].numel)
    nb, ns = node.operands[big].numel, node.operands[small].numel
    if f"in{big}" not in node.saves or nb != node.out.numel or ns >= nb or nb % ns:
        return None

    def rows(n):        # views and row gathers with one consumer: the rows move, their values do not
        one = len(consumers.get(n.name, [])) == 1
        gather = n.target in _GATHER and n.out.numel == n.operands[0].numel and n.operands[0].producer
        return one and (_same_view(n) or bool(gather))
    mm = _back(nodes, node.operands[big].producer, rows)
    if mm is None or mm.kind != "matmul" or not mm.operands or mm.operands[0].param is not None:
        return None
    if not any(o.param is not None for o in mm.operands) or len(consumers.get(mm.name, [])) != 1:
        return None
    act = _back(nodes, mm.operands[0].producer, _same_view)
    return big if act is not None and _recomputable(act) else None


def _kv_source(nodes, o):
    """(tensor id, elements) of the k or v operand `o` of an attention as flash attention reads it:
    the tensor an expand + reshape made every query head's copy from, else the operand itself."""
    ex = _back(nodes, o.producer, _same_view)
    if ex is not None and ex.kind == "view" and "expand" in ex.target and _acts(ex):
        src = ex.operands[_acts(ex)[0]]
        if src.numel < ex.out.numel and src.producer is not None:
            root = _back(nodes, src.producer, _same_view) or nodes[src.producer]
            return root.name, src.numel
    return None, o.numel


def _kv_kept(node, i, nodes):
    """The alias of an attention's k (i = 1) or v (i = 2) under "fused".  Megatron-Core splits q, k, v
    as views of one fused projection's output; where rotary embeddings make q and k new tensors, v
    alone keeps that whole output alive for backward (measured: bench/megatron_saved_activations.py),
    so v is kept as the q + k + v projection."""
    tid, numel = _kv_source(nodes, node.operands[i])
    if i == 2 and len(_acts(node)) >= 3 and all(_acts(node)[j] == j for j in range(3)):
        qroot = _back(nodes, node.operands[0].producer, lambda n: n.kind == "view" and bool(_acts(n)))
        if qroot is not None and qroot.kind not in ("matmul", "view"):
            k_numel = _kv_source(nodes, node.operands[1])[1]
            return [(2, f"{node.name}:qkv", node.operands[0].numel + k_numel + numel)]
    return [(i, tid, numel)] if tid is not None else []


def fused_aliases(graph) -> dict:
    """name -> ((operand index, tensor id, elements), ...): operands a node keeps that the "fused"
    runtime keeps as another tensor (module docstring: grouped-query k, v at their own size; a layout
    copy of a kept attention output as that output)."""
    nodes = graph.nodes
    out = {}
    for node in nodes.values():
        got = []
        for i in _acts(node):
            if f"in{i}" not in node.saves:
                continue
            o = node.operands[i]
            if node.kind == "attention" and i in (1, 2):
                got.extend(_kv_kept(node, i, nodes))
                continue
            prod = nodes.get(o.producer)
            if prod is None or not _same_view(prod):
                continue
            root = _back(nodes, o.producer, _same_view)
            if root is not None and root.kind == "attention" and "out" in root.saves and root.out.numel == o.numel:
                got.append((i, root.name, o.numel))
        if got:
            out[node.name] = tuple(got)
    return out
