"""A DTensor module output made this rank's plain local tensor, which the model may then modify in place.

DTensor's own `to_local()` (what ColwiseParallel / RowwiseParallel / SequenceParallel do with
use_local_output=True) returns a view created inside a custom autograd Function, and autograd forbids
modifying such a view in place: HF Falcon's `mlp_output += attention_output` on a row-split closer's
output stops at step 0 ("Output 0 of _ToTorchTensor is a view and is being modified inplace").  The
same Function with the local tensor detached instead of viewed gives a tensor that is not a view, with
the same backward (the gradient goes back as a DTensor of the output's placements): no copy, so the
step runs as priced.  The local tensor still shares its storage and version counter with the DTensor's,
so an in-place change of a tensor autograd saved fails loudly, as it would without parallelism."""
from __future__ import annotations


def _function():
    from torch.distributed.tensor._api import _ToTorchTensor

    class _ToOwnedLocal(_ToTorchTensor):
        @staticmethod
        def forward(ctx, input, grad_placements):      # noqa: A002 - torch's own signature
            _ToTorchTensor.forward(ctx, input, grad_placements)      # sets what backward reads
            return input._local_tensor.detach()
    return _ToOwnedLocal


_FN = []


def owned_local(t):
    """`t.to_local()` that may be modified in place; anything but a DTensor is returned as is."""
    from torch.distributed.tensor import DTensor
    if not isinstance(t, DTensor):
        return t
    if not _FN:
        _FN.append(_function())
    return _FN[0].apply(t, None)


def local_outputs(mod, args, out):
    """Forward hook: a module's DTensor output(s) as local tensors (a tuple's members one by one)."""
    if isinstance(out, (tuple, list)):
        return type(out)(owned_local(o) for o in out)
    return owned_local(out)


def hand_back_local(module, styles: dict) -> None:
    """Before parallelize_module: each ColwiseParallel / RowwiseParallel in `styles` ({name: style})
    keeps its DTensor output; after it, `register(module, styles)` makes them owned local tensors."""
    for style in styles.values():
        if getattr(style, "use_local_output", False):
            style.use_local_output = False
            style.sapp_owned_local = True


def register(module, styles: dict) -> None:
    mods = dict(module.named_modules())
    for name, style in styles.items():
        if getattr(style, "sapp_owned_local", False) and name in mods:
            mods[name].register_forward_hook(local_outputs)


def local_grad(p):
    """This rank's part of p's gradient, laid out as p is.  DTensor's embedding backward hands a
    vocabulary-split table (Shard(0)) a Replicate gradient, the whole table's on every tp rank: read
    as p's local rows it is the wrong rows (ZeRO-1 slices its owned elements out of it).  Such a
    gradient is redistributed to p's placements first (Replicate -> Shard is a local slice, no
    communication) and kept so."""
    g = p.grad
    if g is None or not hasattr(g, "to_local"):
        return g
    if hasattr(p, "placements") and tuple(g.placements) != tuple(p.placements):
        p.grad = g = g.redistribute(p.device_mesh, p.placements)
    return g.to_local()
