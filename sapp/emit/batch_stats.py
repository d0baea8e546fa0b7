"""BatchNorm under data parallelism: every replica normalises by the global batch's statistics, as
one process does (forward, backward and the running-statistics update).

On CUDA torch's SyncBatchNorm does it; its forward runs only on accelerators, so on CPU (gloo) the
layer becomes `GlobalBatchNorm`: forward all-reduces per-channel (sum, count), then the squared
deviations from the global mean; backward all-reduces (sum dy, sum dy·x̂), so every rank's input
gradient is the one-process gradient of the global loss.  Both keep the original
layer's parameters and buffers (same objects, same names), so optimizers, checkpoints and the
fingerprint see the same model.  Priced in costmodel/batchstats.py."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


class GlobalBatchNorm(_BatchNorm):
    """A batch norm whose training statistics are reduced over `group` (two all-reduces forward, one
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
        # statistics in at least float32 (half inputs widen, as torch's kernel accumulates); a float64
        # model's stay float64 (the harness's rounding-free re-run compares at 1e-9)
        wide = torch.promote_types(x.dtype, torch.float32)
        y, mean, var, n = _GlobalNorm.apply(x.to(wide), self.weight, self.bias, self.eps, self.group)
        if self.training and self.track_running_stats and self.running_mean is not None:
            self._update_running(mean, var, n)
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


class _GlobalNorm(torch.autograd.Function):
    """Batch normalisation by the group's global statistics, forward and backward written as torch's
    own kernels compute them (fewer rounding steps than autograd through the statistics: RegNet's
    Adam steps turn a gradient's last digits into visible loss differences).  Forward: all-reduce
    (sum, count), then the squared deviations from the global mean (two passes, as one process).
    Backward: one all-reduce of (sum dy, sum dy * x_hat); the input gradient is
    w * invstd * (dy - (sum dy + x_hat * sum dy x_hat) / n), the weight and bias gradients this
    rank's own sums (the dp gradient sync averages them, as any parameter's)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, group):
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        shape = [1, c] + [1] * (x.dim() - 2)
        sums = torch.cat([x.sum(dims), x.new_full((1,), x.numel() / c)])
        dist.all_reduce(sums, group=group)
        n = float(sums[c])
        mean = sums[:c] / n
        d = x - mean.view(shape)
        sq = (d * d).sum(dims)
        dist.all_reduce(sq, group=group)
        var = sq / n                                   # biased, as normalisation uses
        invstd = torch.rsqrt(var + eps)
        xhat = d * invstd.view(shape)
        y = xhat if weight is None else xhat * weight.view(shape).to(x.dtype) + bias.view(shape).to(x.dtype)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.n, ctx.group, ctx.dims, ctx.shape = n, group, dims, shape
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var, n

    @staticmethod
    def backward(ctx, dy, _dmean, _dvar, _dn):
        xhat, invstd, weight = ctx.saved_tensors
        dims, shape, c = ctx.dims, ctx.shape, xhat.shape[1]
        local = torch.cat([dy.sum(dims), (dy * xhat).sum(dims)])
        g_w, g_b = (local[c:].clone(), local[:c].clone()) if weight is not None else (None, None)
        dist.all_reduce(local, group=ctx.group)
        scale = invstd if weight is None else invstd * weight.to(xhat.dtype)
        dx = (dy - (local[:c].view(shape) + xhat * local[c:].view(shape)) / ctx.n) * scale.view(shape)
        if weight is not None:
            g_w, g_b = g_w.to(weight.dtype), g_b.to(weight.dtype)
        return dx, g_w, g_b, None, None


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
