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
the producer launches no kernel of its own.  The marks are settings-independent and stamped once per
graph beside the autocast widths (costmodel.dtypes.ensure_widths), so sub-graphs keep them."""
from __future__ import annotations

POINTWISE = ("elementwise", "dropout")
ABSORBS = POINTWISE + ("softmax",)


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
    return {n: (tuple(sorted(fused_in[n])), n in fused_out, tuple(sorted(again[n]))) for n in nodes}
