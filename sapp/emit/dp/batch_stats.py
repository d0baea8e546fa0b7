"""BatchNorm under data parallelism: every replica normalises by the global batch's statistics, as
one process does (forward, backward and the running-statistics update).

The module is never replaced.  A norm's class is swapped, in place, for a subclass of its own class
whose forward runs the original forward under a torch-function mode that catches the batch-norm call
on this module's own tensors (`F.batch_norm` or `torch.batch_norm`) and computes it over the dp
group.  Whatever a subclass does around the normalisation (a vision library's norm + activation
module: BatchNormAct2d applies its activation in `forward`) still runs, its running-statistics rule
(momentum, `num_batches_tracked`) is the one its forward computes, and parameters, buffers, names
and `isinstance` checks are untouched.  (torch's `SyncBatchNorm.convert_sync_batchnorm` builds a
plain layer instead, so a subclass's activation vanishes: dp2 trained to other losses.)

The kernel follows the input: on CUDA torch's own sync function (`_functions.SyncBatchNorm`), on
CPU (gloo) `_GlobalNorm` below.  A group of one passes the call through unchanged.  Priced in
costmodel/batchstats.py."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.overrides import TorchFunctionMode

_SYNCED: dict = {}          # original class -> its synced subclass (one per class, so types compare)


def is_synced(mod: nn.Module) -> bool:
    return getattr(type(mod), "_sapp_global_stats", False)


def _synced_forward(self, *args, **kwargs):
    with _GlobalStats(self):
        return super(type(self), self).forward(*args, **kwargs)


def _synced_class(cls: type) -> type:
    if cls not in _SYNCED:
        # same name and module, so messages, reprs and the manifest's type names stay the user's
        _SYNCED[cls] = type(cls.__name__, (cls,), {"forward": _synced_forward, "_sapp_global_stats": True,
                                                   "__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return _SYNCED[cls]


def _bn_args(func, args, kwargs):
    """(input, running_mean, running_var, weight, bias, training, momentum, eps) of a batch-norm call,
    or None for any other function."""
    if func is F.batch_norm:
        names, defaults = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum",
                           "eps"), (None, None, False, 0.1, 1e-5)
    elif func is torch.batch_norm:
        names, defaults = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum",
                           "eps", "cudnn_enabled"), ()
    else:
        return None
    got = dict(zip(names, args))
    got.update(kwargs)
    for name, d in zip(names[len(names) - len(defaults):], defaults):
        got.setdefault(name, d)
    return tuple(got[k] for k in ("input", "running_mean", "running_var", "weight", "bias", "training",
                                  "momentum", "eps"))


class _GlobalStats(TorchFunctionMode):
    """Active during one synced norm's forward: its own training-mode batch-norm call is computed over
    the module's dp group; every other call (eval mode, other tensors, other ops) runs unchanged."""

    def __init__(self, bn: nn.Module):
        super().__init__()
        self.bn = bn

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        a = _bn_args(func, args, kwargs)
        if a is None or not self._owns(a):
            return func(*args, **kwargs)
        x, rmean, rvar, weight, bias, training, momentum, eps = a
        group = self.bn._sapp_bn_group
        if not training or dist.get_world_size(group) == 1:
            return func(*args, **kwargs)
        if _on_cuda(x):                 # torch's kernels (batch_norm_stats / gather_stats: CUDA only)
            from torch.nn.modules import _functions
            return _functions.SyncBatchNorm.apply(x, weight, bias, rmean, rvar, eps, momentum or 0.0, group,
                                    dist.get_world_size(group))
        # statistics in at least float32 (half inputs widen, as torch's kernel accumulates); a float64
        # model's stay float64 (the harness's rounding-free re-run compares at 1e-9)
        wide = torch.promote_types(x.dtype, torch.float32)
        y, mean, var, n = _GlobalNorm.apply(x.to(wide), weight, bias, eps, group)
        if rmean is not None:
            _update_running(rmean, rvar, mean, var, n, momentum)
        return y.to(x.dtype)

    def _owns(self, a) -> bool:
        """The call normalises with this module's own statistics or affine tensors (a subclass may run
        other batch norms of other tensors inside its forward; those stay local)."""
        mine = [t for t in (self.bn.running_mean, self.bn.running_var, self.bn.weight, self.bn.bias)
                if t is not None]
        if not mine:                    # no affine, no running statistics: the module's only norm
            return True
        return any(t is m for t in a[1:5] if t is not None for m in mine)


def _on_cuda(x) -> bool:
    return x.is_cuda


@torch.no_grad()
def _update_running(rmean, rvar, mean, var, n, momentum):
    """F.batch_norm's update with the momentum the module's forward computed (a cumulative average
    when its momentum is None); unbiased variance over the global count, as one process stores it."""
    f = 0.0 if momentum is None else float(momentum)
    rmean.mul_(1 - f).add_(mean.to(rmean.dtype), alpha=f)
    unbiased = var * (n / max(n - 1.0, 1.0))
    rvar.mul_(1 - f).add_(unbiased.to(rvar.dtype), alpha=f)


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


def sync_batch_norms(module: nn.Module, group) -> int:
    """Make every BatchNorm under `module` (and the root, if one) normalise by the dp group's global
    batch: each keeps its object, class behaviour and tensors (see the module docstring); returns how
    many.  torch's own SyncBatchNorm already syncs and is left alone."""
    count = 0
    for mod in module.modules():
        if isinstance(mod, _BatchNorm) and not isinstance(mod, nn.SyncBatchNorm) and not is_synced(mod):
            mod.__class__ = _synced_class(type(mod))
            mod._sapp_bn_group = group
            count += 1
    return count
