"""Capturing a model at one rank's layer shapes, shared by the shape audit (shape_audit.py) and the
sequence-parallel audit (sp_audit.py)."""
from __future__ import annotations

import contextlib
import io
import logging

from torch import nn


@contextlib.contextmanager
def swapped(model: nn.Module, local: dict):
    saved = []
    for name, stand_in in local.items():
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        saved.append((owner, child, getattr(owner, child)))
        setattr(owner, child, stand_in)
    try:
        yield
    finally:
        for owner, child, original in saved:
            setattr(owner, child, original)
        # a forward that rebuilds a submodule and hands it the layers (BigBird's set_attention_type on its
        # first call: `new.query = self.self.query`) took a stand-in along: put the layer back there too
        back = {id(stand_in): original for (_, _, original), stand_in in zip(saved, local.values())}
        for mod in list(model.modules()):
            for child, m in list(mod._modules.items()):
                if id(m) in back:
                    mod._modules[child] = back[id(m)]


@contextlib.contextmanager
def quiet():
    """torch.export logs a failed fake-tensor op with its whole stack (and fx's shape propagation
    prints it): the audit's one line says it."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        log.setLevel(level)


def targets(model, example_inputs):
    """Targets sized to the audit's own token inputs (a zoo model's default targets take the spec's
    sequence length, which a shorter audit input would not match); None for other models."""
    import sapp.models as models
    first = example_inputs[0] if example_inputs else None
    if getattr(model, "sapp_spec", None) is None or first is None or first.dim() < 2 or first.is_floating_point():
        return None
    return models.example_targets(model, first.shape[0], first.device, seq=int(first.shape[1]))
