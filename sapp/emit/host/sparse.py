"""Device-resident embedding tables with sparse gradients (nn.Embedding(sparse=True) that the plan keeps
on the device), run the way the cost model prices them:

- gradient sync: every data-parallel rank's touched (indices, rows) are all-gathered and summed, then
  averaged -- what `costmodel.gradsync.sparse_sync_time` prices (latency + the rows of every rank); no
  dense all-reduce of the table.  Plain all-gathers, so it runs on gloo and NCCL alike (NCCL has no
  sparse all-reduce);
- outside DDP / FSDP2 / ZeRO-1 (they take no sparse gradients): the table and its optimizer states stay
  whole on every rank, which is how `costmodel.memory.model_state_bytes` prices a sparse table at any
  ZeRO stage;
- optimizer: torch.optim.SparseAdam (lazy Adam: only touched rows move; dense exp_avg / exp_avg_sq,
  the 8 B per fp32 parameter Adam's states are priced at).

    names = table_names(module)          # qualnames of device sparse tables' weights
    hook = SparseGradSync(params, group) # call after backward
    opt = optimizer(params, lr)          # SparseAdam, tagged like the other optimizers
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def table_names(module: nn.Module) -> list:
    """Qualnames of trainable nn.Embedding(sparse=True) weights that live on the device (host tables,
    `emit.host.HostEmbedding`, are the placement code's)."""
    from .host import HostEmbedding
    out = []
    for name, mod in module.named_modules():
        if isinstance(mod, nn.Embedding) and mod.sparse and not isinstance(mod, HostEmbedding) \
                and mod.weight.requires_grad:
            out.append(f"{name}.weight" if name else "weight")
    return sorted(out)


def average(grad: torch.Tensor | None, shape, like: torch.Tensor, group) -> torch.Tensor:
    """The mean over `group` of every rank's sparse gradient (None: this rank touched no row), as a
    coalesced sparse tensor; all-gathers of the row counts, then of indices and rows (padded)."""
    world = dist.get_world_size(group)
    if grad is None:
        idx = torch.empty((0,), dtype=torch.long, device=like.device)
        val = torch.empty((0,) + tuple(shape[1:]), dtype=like.dtype, device=like.device)
    else:
        g = grad.coalesce()
        idx, val = g.indices()[0], g.values()
    n = torch.tensor([idx.numel()], dtype=torch.long, device=like.device)
    counts = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(counts, n, group=group)
    top = int(max(c.item() for c in counts))
    pad_i = torch.zeros((top,), dtype=torch.long, device=like.device)
    pad_v = torch.zeros((top,) + tuple(shape[1:]), dtype=val.dtype, device=like.device)
    pad_i[:idx.numel()], pad_v[:idx.numel()] = idx, val
    all_i = [torch.empty_like(pad_i) for _ in range(world)]
    all_v = [torch.empty_like(pad_v) for _ in range(world)]
    dist.all_gather(all_i, pad_i, group=group)
    dist.all_gather(all_v, pad_v, group=group)
    k = [int(c.item()) for c in counts]
    cat_i = torch.cat([a[:c] for a, c in zip(all_i, k)])
    cat_v = torch.cat([a[:c] for a, c in zip(all_v, k)])
    out = torch.sparse_coo_tensor(cat_i.unsqueeze(0), cat_v / world, tuple(shape))
    return out.coalesce()


class SparseGradSync:
    """After backward: average the device sparse tables' gradients over the data-parallel group."""

    def __init__(self, params: list, group):
        self.params, self.group = list(params), group

    def __call__(self):
        for p in self.params:
            p.grad = average(p.grad, p.shape, p, self.group)


def optimizer(params: list, lr: float, betas=(0.9, 0.999), eps=1e-8):
    """SparseAdam over the tables (the device optimizer for sparse gradients)."""
    opt = torch.optim.SparseAdam(list(params), lr=lr, betas=betas, eps=eps)
    opt.sapp_kind, opt.sapp_where = "sparse_adam", "device"
    return opt


__all__ = ["table_names", "average", "SparseGradSync", "optimizer"]
