"""Building a model on the meta device without running its initialisers.

A meta tensor has a shape and a dtype but no values, so `nn.init.normal_`, `Tensor.uniform_` and the
like change nothing on it - yet each still runs torch's reference implementation (and the first one
imports torch._dynamo): most of the time `sapp.models.get("gpt3-175b")` took.  Inside `skip_init()`
those calls return their meta tensor untouched; everything else (shapes, dtypes, requires_grad, tied
weights) is built exactly as without it, and tensors on any other device are initialised as usual."""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

# value-only initialisers: each fills its first argument in place and returns it, shape and dtype unchanged
_INIT = ("normal_", "uniform_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
         "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")
_TENSOR = ("normal_", "uniform_", "zero_", "fill_", "bernoulli_", "exponential_", "random_", "geometric_",
           "log_normal_", "cauchy_", "erfinv_", "clamp_", "mul_", "add_", "sub_", "div_", "copy_", "fill_diagonal_")
SKIPPED = frozenset([getattr(torch.nn.init, n) for n in _INIT if hasattr(torch.nn.init, n)]
                    + [getattr(torch.Tensor, n) for n in _TENSOR if hasattr(torch.Tensor, n)])


class skip_init(TorchFunctionMode):
    """Context: value initialisers on meta tensors return the tensor as it is (see the module doc)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SKIPPED:
            # nn.init passes its tensor by keyword (`tensor=`), Tensor methods as `self`
            t = args[0] if args else kwargs.get("tensor")
            if isinstance(t, torch.Tensor) and t.is_meta:
                return t
        return func(*args, **kwargs)
