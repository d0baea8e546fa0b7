"""Resharding cost on an activation edge, forward (value) and backward (gradient)."""
from __future__ import annotations

from .dtypes import out_bytes
from .fp8 import edge_width
from .grads import carries_grad
from .layouts import P, R, input_grad_layout, input_layout, output_grad_layout, output_layout, reshard_time


def translate(prod_out, operand, layout) -> tuple:
    """Express a producer-output layout in the consumer operand's axes.  They are the same tensor;
    when the recorded shapes differ (a view folded into the edge) a sharded axis is kept only where
    the sizes agree, otherwise it is marked as a foreign axis (moving from it costs a collective)."""
    if tuple(prod_out.shape) == tuple(operand.shape):
        return layout
    out = []
    for c in layout:
        if c >= 0 and not (c < len(operand.shape) and c < len(prod_out.shape)
                           and prod_out.shape[c] == operand.shape[c]):
            c = 1000 + c
        out.append(c)
    return tuple(out)


def _folds(consumer, operand) -> tuple:
    """The (input axes, output axes) merges and unmerges of reshape `consumer` reading `operand` whose
    outermost output axis is the data batch: rows that every later op treats on their own, so which
    rows a rank holds is free (a head-dim unmerge of `(h d)` is not: its inner factor is no batch)."""
    folds = consumer.extra.get("folds") if consumer is not None else None
    if not folds or consumer.operands[0] is not operand:       # most edges: no reshape, checked first
        return ()
    batch = {d.name for d in consumer.dims if d.batch}
    return tuple((gi, gj) for gi, gj in folds if consumer.out.dims[gj[0]] in batch)


def fold_src(layout, operand, consumer) -> tuple:
    """A producer layout in the consumer operand's axes, a split on an inner axis of a merge read as a
    split of the merged axis (the capture maps a merge to its outermost axis): a rank holding part
    of the inner factor holds its own rows of the merged axis - local-attention's heads folded into
    `(b h)` move no byte (search/tp_fold.py)."""
    remap = {a: gi[0] for gi, gj in _folds(consumer, operand) if len(gj) == 1 for a in gi[1:]}
    return tuple(remap.get(c, c) for c in layout) if remap else layout


def fold_dst(layout, strategy, operand, consumer) -> tuple:
    """A consumer's operand layout (value or gradient) where reshape `consumer` unmerges an axis and
    splits an inner factor of it: those are the rank's own rows of the merged axis, not a gather."""
    inner = {consumer.out.dims[j]: gi[0] for gi, gj in _folds(consumer, operand) if len(gi) == 1 for j in gj[1:]}
    if not inner:
        return layout
    return tuple(inner[d] if d in inner and c in (R, P) else c for c, d in zip(layout, strategy))


def edge_layouts(prod_node, operand, s_prod, s_cons, consumer=None):
    """(fwd src, fwd dst, bwd src, bwd dst) layouts in the consumer operand's axes (`consumer`: the
    node reading `operand`, whose merges and unmerges of axes are read: `fold_src`, `fold_dst`)."""
    out_l = output_layout(prod_node, s_prod)
    f_src = fold_src(translate(prod_node.out, operand, out_l), operand, consumer)
    f_dst = fold_dst(input_layout(operand.dims, s_cons), s_cons, operand, consumer)
    b_src = fold_dst(input_grad_layout(operand.dims, s_cons), s_cons, operand, consumer)
    b_dst = fold_src(translate(prod_node.out, operand, output_grad_layout(out_l)), operand, consumer)
    return f_src, f_dst, b_src, b_dst


def edge_times(prod_node, operand, s_prod, s_cons, mesh, cluster, settings, consumer=None):
    """(forward seconds, backward seconds) of resharding one edge (`consumer`: the node reading
    `operand`, for the FP8 tensor-parallel widths of costmodel/fp8.py)."""
    f_src, f_dst, b_src, b_dst = edge_layouts(prod_node, operand, s_prod, s_cons, consumer)
    # the producer's tensor moves as it is (a consumer's autocast cast comes after it arrives)
    eb = out_bytes(prod_node, settings) if settings.is_float(operand.dtype) else settings.act_bytes(operand.dtype)
    fwd = reshard_time(f_src, f_dst, operand.numel * edge_width(prod_node, consumer, False, settings, eb), mesh,
                       cluster)
    # no gradient comes back along an edge whose tensor carries none (costmodel.grads)
    bwd = (reshard_time(b_src, b_dst, operand.numel * edge_width(prod_node, consumer, True, settings, eb), mesh,
                        cluster) if settings.is_float(operand.dtype) and carries_grad(prod_node) else 0.0)
    return fwd, bwd


def edge_cost(graph, producer, consumer, operand_index, s_prod, s_cons, mesh, cluster, settings) -> float:
    """Seconds of forward + backward resharding on the edge producer -> consumer.operands[i]."""
    p = graph.nodes[producer] if isinstance(producer, str) else producer
    c = graph.nodes[consumer] if isinstance(consumer, str) else consumer
    fwd, bwd = edge_times(p, c.operands[operand_index], s_prod, s_cons, mesh, cluster, settings, consumer=c)
    return fwd + bwd


__all__ = ["edge_cost", "edge_times", "edge_layouts", "fold_dst", "fold_src", "R"]
