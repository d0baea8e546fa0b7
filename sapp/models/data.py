"""Example data for a model that is not in the zoo: the inputs, targets and loss a factory or a
Hugging Face config gives, at any batch size.

A `DataSpec` holds one example batch (a tuple of tensors with the sample axis first, the targets, a
loss).  `inputs(batch)` tiles its rows to `batch` (meta tensors: only the shape changes), so search
can capture at its batch and `sapp run` can build each step's global batch from the same rows.  The
resolver (sapp/models/resolve.py) attaches one to the module as `sapp_data`; sapp.models'
example_inputs / example_targets / loss_fn read it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataSpec:
    inputs: tuple                 # one example batch, sample axis first
    targets: object = None        # tensor with the same leading axis, or None (no loss)
    loss_fn: object = None        # loss_fn(output, targets) -> scalar; output as the model returns it

    def __post_init__(self):
        self.inputs = tuple(self.inputs) if isinstance(self.inputs, (tuple, list)) else (self.inputs,)

    @property
    def batch(self) -> int:
        return int(self.inputs[0].shape[0]) if self.inputs and getattr(self.inputs[0], "dim", lambda: 0)() else 1

    def inputs_at(self, batch: int, device=None) -> tuple:
        return tuple(_tile(x, batch, device) for x in self.inputs)

    def targets_at(self, batch: int, device=None):
        return None if self.targets is None else _tile(self.targets, batch, device)


def _tile(x, batch, device):
    """x with its leading axis cycled to `batch` rows, on `device` (default: x's)."""
    import torch
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return x
    dev = torch.device(device) if device is not None else x.device
    if x.device.type == "meta" or dev.type == "meta":
        return torch.empty((batch,) + tuple(x.shape[1:]), dtype=x.dtype, device=dev)
    idx = torch.arange(batch, device=x.device) % x.shape[0]
    return x[idx].to(dev)


def logits_of(out):
    """A model's main output: .logits of an HF ModelOutput, the first element of a tuple, or itself."""
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def token_loss(output, target):
    """Cross-entropy over the last axis for [b, s, V] logits (an HF ModelOutput's too) and [b, s] ids."""
    from torch.nn import functional as F
    logits = logits_of(output)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def class_loss(output, target):
    from torch.nn import functional as F
    return F.cross_entropy(logits_of(output), target)
