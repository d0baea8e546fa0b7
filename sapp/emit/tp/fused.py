"""Fused q/k/v projections split by heads, and their checkpoints in the model's own layout.

A fused projection (`qkv = Linear(h, 3h)` then `chunk(3)`, or grouped-query `split([q, kv, kv])`) lays
its output rows out piece by piece: all of q, then all of k, then all of v.  DTensor's ColwiseParallel
gives rank r the r-th contiguous block of rows, which would hold q's heads only on rank 0.  So before
the layer is sharded its rows are put in *rank order*: rank 0's share of every piece, then rank 1's,
... (`order`); each rank's block is then [q_r, k_r, v_r] and the model's own `chunk` / `split` (its
sizes localised by the shape audit) hands each rank its heads of q, k and v, as Megatron's
interleaved layout does.  The search found the pieces (sapp/search/tp_layout.py `fused_parts`) and
the shape audit finds them again on the model it runs (`parts` here comes from that capture, so a
plan edited by hand cannot turn the reordering off).

Checkpoints keep the model's own row order (sapp/emit/runtime/fused_checkpoint.py), so they load
under any other plan."""
from __future__ import annotations

import torch

from . import conv1d


def order(sizes, tp: int) -> list:
    """Model rows in rank order: for each rank, its share of each piece in turn."""
    offs = [sum(sizes[:j]) for j in range(len(sizes))]
    return [offs[j] + r * (n // tp) + i for r in range(tp) for j, n in enumerate(sizes) for i in range(n // tp)]


def segments(sizes, tp: int) -> list:
    """[(start in rank order, start in the model's order, rows)]: the runs contiguous in both."""
    out, at = [], 0
    offs = [sum(sizes[:j]) for j in range(len(sizes))]
    for r in range(tp):
        for j, n in enumerate(sizes):
            out.append((at, offs[j] + r * (n // tp), n // tp))
            at += n // tp
    return out


def axis_of(module, inputs: bool = False) -> int:
    """The weight axis of the output features (`inputs`: of the input features): HF's Conv1D stores
    [in, out]."""
    return (1 if conv1d.is_conv1d(module) else 0) ^ int(inputs)


def permute_(module, sizes, tp: int, inputs: bool = False) -> None:
    """Reorder `module`'s output rows (weight and bias) from the model's order to rank order;
    `inputs`: its input columns instead (a row-split closer reading query heads in that order,
    sapp/search/tp_regroup.py; its bias is added whole)."""
    idx = torch.tensor(order(sizes, tp), device=module.weight.device)
    ax = axis_of(module, inputs)
    with torch.no_grad():
        module.weight.data = module.weight.data.index_select(ax, idx).contiguous()
        if not inputs and getattr(module, "bias", None) is not None:
            module.bias.data = module.bias.data.index_select(0, idx).contiguous()


def entries(modules_parts: dict, module_of, tp: int, inputs=frozenset()) -> dict:
    """{parameter name: (axis, sizes, tp)} of the permuted layers' weights and biases, for the
    checkpoint planners.  `module_of(name)`: the running module; `inputs`: the names permuted by
    input columns."""
    out = {}
    for name, sizes in modules_parts.items():
        mod = module_of(name)
        out[f"{name}.weight"] = (axis_of(mod, name in inputs), tuple(sizes), tp)
        if name not in inputs and getattr(mod, "bias", None) is not None:
            out[f"{name}.bias"] = (0, tuple(sizes), tp)
    return out
