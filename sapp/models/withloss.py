"""`WithLoss`: a model and its loss as one module, so capture records the loss op.  Its own file
because it subclasses torch.nn.Module: `sapp.models` imports it on first use (zoo names and configs
come without torch)."""
from __future__ import annotations

import torch

from .zoo import loss_fn as _default_loss
from .data import logits_of


class WithLoss(torch.nn.Module):
    """model + loss as one module: forward(*inputs, target) -> scalar loss.  Capture uses it so the
    loss op is part of the graph; the wrapped model is the child `model` (qualnames get a `model.`
    prefix, which capture strips).  The loss contract, the same at capture and at run
    (sapp/emit/runtime/program.py): `loss_fn(logits, targets)` where logits = `data.logits_of(output)` (an
    HF ModelOutput's .logits, a tuple's first element, else the output itself)."""

    def __init__(self, model, loss_fn=None):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn if loss_fn is not None else _default_loss(model)
        spec = getattr(model, "sapp_spec", None)
        if spec is not None:
            self.sapp_spec = spec

    def forward(self, *inputs, target):
        return self.loss_fn(logits_of(self.model(*inputs)), target)
