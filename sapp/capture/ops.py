"""Per-operator rules: ATen op -> iteration space (dims), operand/out dim mapping, FLOPs, saves.

A handler gets an `OpCall` (the op name, its tensor inputs in argument order, the other arguments,
the output shape) and returns a `Spec` (sapp/capture/opspec.py).  Names follow
sapp/capture/ir.py: linear `b0.., n, k`; batched matmul `b0.., m, n, k`; grouped expert GEMM
`b0, n, k, e`; embedding `b0.., v, h`; conv `b0, o, c, <spatial>`; everything else `a0, a1, ...`
over the output axes.  FLOP conventions: matmul/conv 2 per multiply-add (bias adds not counted, as
torch.utils.flop_counter), element-wise 1 per output element, normalisation and softmax 5 per
element, views and lookups 0.  The families live one per file (ops_pointwise, ops_contract,
ops_norm, ops_view, ops_index, ops_recurrent); this file is the table.  An op in no family gets
`generic` and is flagged unknown (`extra["generic"]`), which the plan's notes report."""
from __future__ import annotations

from .opspec import OpCall, Spec, Tin, TRef, generic, prod  # noqa: F401 - the handler vocabulary
from .ops_contract import (addmm, conv, conv_transpose, convolution, einsum, embedding, embedding_bag, fft,
                           grouped_mm, linear, matmul, sdpa)
from .ops_complex import polar, view_as_complex, view_as_real
from .ops_index import cumsum, diff, gather, histc, index, index_put, index_select, one_hot, sort, topk
from .ops_norm import (batch_norm, cross_entropy, group_norm, layer_norm, pointwise_loss, pool, reduction, rms_norm,
                       softmax, upsample)
from .ops_pointwise import ELEMENTWISE, dropout, elementwise
from .ops_recurrent import GATES, recurrent
from .ops_view import (as_strided, cat, col2im, creation, expand, identity, im2col, movedim, pad, permute,  # noqa: F401
                       repeat_interleave, reshape, reshape_groups, select, slice_, stack, windows)

HANDLERS = {
    "linear": linear, "addmm": addmm, "mm": matmul, "bmm": matmul, "matmul": matmul, "baddbmm": matmul,
    "einsum": einsum, "scaled_dot_product_attention": sdpa, "_scaled_dot_product_flash_attention": sdpa,
    "_scaled_dot_product_efficient_attention": sdpa,
    "conv1d": conv, "conv2d": conv, "conv3d": conv, "convolution": convolution, "_convolution": convolution,
    "conv_transpose1d": conv_transpose, "conv_transpose2d": conv_transpose, "conv_transpose3d": conv_transpose,
    "embedding": embedding, "embedding_bag": embedding_bag, "_embedding_bag": embedding_bag,
    "_grouped_mm": grouped_mm, "grouped_mm": grouped_mm, "grouped_mm_fallback": grouped_mm,
    "layer_norm": layer_norm, "native_layer_norm": layer_norm, "rms_norm": rms_norm, "_fused_rms_norm": rms_norm,
    "batch_norm": batch_norm, "_native_batch_norm_legit_functional": batch_norm,
    "_native_batch_norm_legit": batch_norm, "native_batch_norm": batch_norm, "instance_norm": group_norm,
    "group_norm": group_norm, "native_group_norm": group_norm,
    "softmax": softmax, "_softmax": softmax, "log_softmax": softmax, "_log_softmax": softmax,
    "dropout": dropout, "native_dropout": dropout, "feature_dropout": dropout, "alpha_dropout": dropout,
    "sum": reduction, "mean": reduction, "amax": reduction, "amin": reduction, "max": reduction,
    "min": reduction, "prod": reduction, "logsumexp": reduction, "nansum": reduction, "var": reduction,
    "std": reduction, "norm": reduction, "argmax": reduction, "argmin": reduction, "any": reduction,
    "all": reduction, "linalg_vector_norm": reduction,
    "max_pool1d": pool, "max_pool2d": pool, "max_pool3d": pool, "max_pool2d_with_indices": pool,
    "avg_pool1d": pool, "avg_pool2d": pool, "avg_pool3d": pool, "adaptive_avg_pool1d": pool,
    "adaptive_avg_pool2d": pool, "adaptive_avg_pool3d": pool, "_adaptive_avg_pool2d": pool,
    "adaptive_max_pool2d": pool, "upsample_nearest1d": upsample, "upsample_nearest2d": upsample,
    "upsample_nearest3d": upsample, "upsample_linear1d": upsample, "upsample_bilinear2d": upsample,
    "upsample_trilinear3d": upsample, "upsample_bicubic2d": upsample, "_upsample_nearest_exact2d": upsample,
    "cross_entropy_loss": cross_entropy, "nll_loss": cross_entropy, "nll_loss_nd": cross_entropy,
    "binary_cross_entropy_with_logits": pointwise_loss, "binary_cross_entropy": pointwise_loss,
    "mse_loss": pointwise_loss, "l1_loss": pointwise_loss, "smooth_l1_loss": pointwise_loss,
    "huber_loss": pointwise_loss,
    "view": reshape, "reshape": reshape, "_unsafe_view": reshape, "flatten": reshape, "unflatten": reshape,
    "squeeze": reshape, "unsqueeze": reshape, "view_as": reshape, "reshape_as": reshape,
    "permute": permute, "transpose": permute, "t": permute, "numpy_T": permute, "swapaxes": permute,
    "swapdims": permute, "movedim": movedim, "moveaxis": movedim, "unfold": windows,
    "expand": expand, "expand_as": expand, "repeat": expand, "broadcast_to": expand,
    "fft_fft": fft, "fft_ifft": fft, "fft_rfft": fft, "fft_irfft": fft, "fft_fft2": fft, "fft_ifft2": fft,
    "fft_fftn": fft, "fft_ifftn": fft, "fft_rfftn": fft, "fft_irfftn": fft, "real": identity, "imag": identity,
    "alias": identity, "detach": identity, "contiguous": identity, "clone": identity,
    "lift_fresh_copy": identity, "view_copy": reshape, "_to_copy": identity, "to": identity,
    "type_as": identity, "copy": identity,
    "slice": slice_, "narrow": slice_, "select": select, "cat": cat, "concat": cat, "concatenate": cat,
    "stack": stack, "repeat_interleave": repeat_interleave, "pad": pad, "constant_pad_nd": pad,
    "im2col": im2col, "col2im": col2im, "view_as_real": view_as_real, "view_as_complex": view_as_complex,
    "polar": polar, "as_strided": as_strided,
    "arange": creation, "zeros": creation, "ones": creation, "full": creation, "empty": creation,
    "zeros_like": creation, "ones_like": creation, "full_like": creation, "empty_like": creation,
    "new_ones": creation, "new_zeros": creation, "new_full": creation, "new_empty": creation,
    "scalar_tensor": creation, "tensor": creation, "rand": creation, "randn": creation,
    "rand_like": creation, "randn_like": creation, "randint": creation, "linspace": creation, "eye": creation,
    "cumsum": cumsum, "cumprod": cumsum, "cummax": cumsum, "cummin": cumsum, "diff": diff,
    "gather": gather, "index": index, "_unsafe_index": index, "index_select": index_select,
    "index_put": index_put, "_index_put_impl": index_put, "_unsafe_index_put": index_put,
    "scatter": index_put, "scatter_add": index_put, "scatter_reduce": index_put, "index_add": index_put,
    "index_copy": index_put, "index_fill": index_put, "masked_scatter": index_put,
    "topk": topk, "sort": sort, "argsort": sort, "msort": sort, "histc": histc, "bincount": histc,
    "one_hot": one_hot,
}
for _op in GATES:
    HANDLERS[_op] = recurrent
for _op in ELEMENTWISE:
    HANDLERS.setdefault(_op, elementwise)
HANDLERS["_to_copy"] = identity
HANDLERS["to"] = identity
HANDLERS["type_as"] = identity
HANDLERS["copy"] = identity
HANDLERS["scalar_tensor"] = creation


def spec_for(c: OpCall) -> Spec:
    """The op's Spec; a handler that cannot read this call (an overload it was not written for)
    falls back to `generic`, flagged unknown like an op with no handler."""
    h = HANDLERS.get(c.op)
    if h is None:
        return generic(c)
    try:
        return h(c)
    except Exception:             # noqa: BLE001 - an unreadable overload is an unknown op, not a crash
        return generic(c)
