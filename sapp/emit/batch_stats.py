"""BatchNorm under data parallelism: every replica normalises by the global batch's statistics, as
one process does (forward, backward and the running-statistics update).

On CUDA torch's SyncBatchNorm does it; its forward runs only on accelerators, so on CPU (gloo) the
layer becomes `GlobalBatchNorm`, which all-reduces per-channel (sum, sum of squares, count) through
torch.distributed.nn's autograd all-reduce: the backward all-reduces their gradients, so every
rank's input gradient is the one-process gradient of the global loss.  Both keep the original
layer's parameters and buffers (same objects, same names), so optimizers, checkpoints and the
fingerprint see the same model.  Priced in costmodel/batchstats.py."""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


class GlobalBatchNorm(_BatchNorm):
    """A batch norm whose training statistics are reduced over `group` (one all-reduce forward, one
    backward).  Outside training with running statistics it is the plain layer."""

    def __init__(self, src: _BatchNorm, group):
        super().__init__(src.num_features, src.eps, src.momentum, src.affine, src.track_running_stats,
                         device="meta")
        self.weight, self.bias = src.weight, src.bias
        self.running_mean, self.running_var = src.running_mean, src.running_var
        self.num_batches_tracked = src.num_batches_tracked
        self.training = src.training
        self.group = group
        self._check_dims = src._check_input_dim

    def _check_input_dim(self, x):
        self._check_dims(x)

    def forward(self, x):
        self._check_input_dim(x)
        use_batch = self.training or self.running_mean is None
        if not use_batch:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        from torch.distributed.nn.functional import all_reduce
        # (torch 2.13 marks it deprecated for _functional_collectives.all_reduce, which has no autograd)
        warnings.filterwarnings("ignore", message="torch.distributed.nn.functional.all_reduce is deprecated")
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        xf = x.float()
        local = torch.cat([xf.sum(dims), (xf * xf).sum(dims), xf.new_full((1,), x.numel() / c)])
        stats = all_reduce(local, group=self.group)          # autograd: backward all-reduces the gradient
        n = stats[2 * c]
        mean = stats[:c] / n
        var = (stats[c:2 * c] / n - mean * mean).clamp_min(0.0)   # biased, as normalisation uses
        shape = [1, c] + [1] * (x.dim() - 2)
        y = (xf - mean.view(shape)) * torch.rsqrt(var + self.eps).view(shape)
        if self.weight is not None:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        if self.training and self.track_running_stats and self.running_mean is not None:
            self._update_running(mean.detach(), var.detach(), n.item())
        return y.to(x.dtype)

    @torch.no_grad()
    def _update_running(self, mean, var, n):
        # _BatchNorm.forward's rule: momentum None is a cumulative average; unbiased variance over
        # the global count, as one process's batch_norm stores it
        self.num_batches_tracked.add_(1)
        f = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        self.running_mean.mul_(1 - f).add_(mean.to(self.running_mean.dtype), alpha=f)
        unbiased = var * (n / max(n - 1.0, 1.0))
        self.running_var.mul_(1 - f).add_(unbiased.to(self.running_var.dtype), alpha=f)


def sync_batch_norms(module: nn.Module, group, device) -> int:
    """Replace every BatchNorm under `module` (in place, the same parameters and buffers) by one
    whose statistics are the dp group's global batch's; returns how many.  The root itself is not
    replaced (a bare BatchNorm model is not a case the emitter meets)."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, _BatchNorm) and not isinstance(child, (nn.SyncBatchNorm, GlobalBatchNorm)):
            setattr(module, name, _synced(child, group, device))
            count += 1
        else:
            count += sync_batch_norms(child, group, device)
    return count


def _synced(bn: _BatchNorm, group, device) -> nn.Module:
    if device.type == "cuda":           # torch's own (same parameter and buffer objects)
        return nn.SyncBatchNorm.convert_sync_batchnorm(bn, process_group=group)
    return GlobalBatchNorm(bn, group)
