"""Tensor parallelism for Hugging Face's `Conv1D` (transformers.pytorch_utils): GPT-2's, GPT-SW3's,
ImageGPT's, Decision Transformer's linears.  It is a linear whose weight is stored [in, out] and
computed as `addmm(bias, x.view(-1, in), weight)`, so the search sees it as a linear with a (k, n)
weight (sapp/search/tp_layout.py) and cuts n (column split) or k (row split) as for nn.Linear.

torch's ColwiseParallel / RowwiseParallel refuse any module but nn.Linear / nn.Embedding (their
`_apply` dispatches on the class), and their Linear partition shards weight dim 0 for a column split,
which on Conv1D's [in, out] layout would cut the input features.  So two small subclasses keep
everything of torch's styles (input / output layouts, SP keywords, the hooks) and change only the
partition, mapped onto the transposed layout:

    column split (out features n)   weight Shard(1), bias Shard(0): each rank computes its out slice
    row split (in features k)       weight Shard(0), bias Replicate: DTensor's addmm gives partial
                                    sums, the bias counted once, reduced by the output redistribute

Conv1D's forward reads `self.nf` (global out features) for its output view; under DTensor that view
is of the global shape, so nothing on the module changes.  A fused q|k|v Conv1D (GPT-2's c_attn) is
not split this way: its output is cut into q, k, v by `split`, which the layout cannot carry (the
region is invalid and stays replicated; a contiguous Shard(1) would give rank 0 all of q and half of k).

Detected by class name (no transformers import): a `Conv1D` in the module's MRO with int `nf` / `nx`
and a weight of shape (nx, nf)."""
from __future__ import annotations

import torch
from torch import nn


def is_conv1d_class(cls) -> bool:
    return isinstance(cls, type) and any(c.__name__ == "Conv1D" for c in cls.__mro__)


def is_conv1d(m) -> bool:
    if not is_conv1d_class(type(m)):
        return False
    w = getattr(m, "weight", None)
    nf, nx = getattr(m, "nf", None), getattr(m, "nx", None)
    return (isinstance(w, torch.Tensor) and type(nf) is int and type(nx) is int and w.dim() == 2
            and tuple(w.shape) == (nx, nf) and not any(True for c in m.children() for _ in c.parameters()))


def _distribute(module, mesh, placements: dict, src_data_rank) -> None:
    from torch.distributed.tensor import distribute_tensor
    for name, param in list(module.named_parameters(recurse=False)):
        dist = distribute_tensor(param, mesh, [placements[name]], src_data_rank=src_data_rank)
        module.register_parameter(name, nn.Parameter(dist, requires_grad=param.requires_grad))


def _styles():
    from functools import partial

    from torch.distributed.tensor import Replicate, Shard, distribute_module
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    class ColwiseConv1D(ColwiseParallel):
        """ColwiseParallel over Conv1D's [in, out] weight: out features are its dim 1."""

        def _apply(self, module, device_mesh):
            if not is_conv1d(module):
                return super()._apply(module, device_mesh)
            return distribute_module(
                module, device_mesh,
                lambda _n, m, mesh: _distribute(m, mesh, {"weight": Shard(1), "bias": Shard(0)},
                                                self.src_data_rank),
                partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))

    class RowwiseConv1D(RowwiseParallel):
        """RowwiseParallel over Conv1D's [in, out] weight: in features are its dim 0."""

        def _apply(self, module, device_mesh):
            if not is_conv1d(module):
                return super()._apply(module, device_mesh)
            self.desired_input_layouts = (Shard(-1),)       # as torch's Linear case: input split on in
            return distribute_module(
                module, device_mesh,
                lambda _n, m, mesh: _distribute(m, mesh, {"weight": Shard(0), "bias": Replicate()},
                                                self.src_data_rank),
                partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))

    return ColwiseConv1D, RowwiseConv1D


_CACHE = []


def styles():
    """(ColwiseConv1D, RowwiseConv1D): torch's styles, for a Conv1D partitioned on its own layout."""
    if not _CACHE:
        _CACHE.extend(_styles())
    return tuple(_CACHE)


def resized(m: nn.Module, k: int, n: int) -> nn.Module:
    """A copy of Conv1D `m` with a (k, n) weight (and n bias) and nx=k, nf=n: this rank's shapes, for
    tracing a pipeline stage and the shape audit (parallel.local_layers)."""
    import copy
    new = copy.copy(m)
    new._parameters = dict(m._parameters)
    new._buffers, new._modules = dict(m._buffers), dict(m._modules)
    w = m.weight
    new.weight = nn.Parameter(torch.zeros((k, n), dtype=w.dtype, device=w.device), requires_grad=w.requires_grad)
    if getattr(m, "bias", None) is not None:
        new.bias = nn.Parameter(torch.zeros(n, dtype=w.dtype, device=w.device))
    new.nx, new.nf = k, n
    return new
