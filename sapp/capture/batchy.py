"""Modules that normalise by batch statistics, read off the module tree (not the graph): a branch the
example inputs do not take (Granite Speech's audio encoder, run only with audio features) holds
BatchNorms the captured graph never shows, yet the emitter refuses any train-mode one under a split
batch (emit/checks.check_batch_statistics).  Capture records them so the search plans what the
emitter runs."""
from __future__ import annotations

import torch
from torch import nn


def is_batchy(mod: nn.Module) -> bool:
    """A torch BatchNorm, or any layer keeping running batch statistics (HF's own batch norms)."""
    return isinstance(mod, nn.modules.batchnorm._BatchNorm) or (
        isinstance(getattr(mod, "running_mean", None), torch.Tensor) and hasattr(mod, "momentum"))


def batch_stat_modules(model: nn.Module) -> dict:
    """{qualname: "torch" | "other"} of the train-mode modules normalising by batch statistics
    ("other": a class the emitter cannot sync over dp), in module order."""
    return {name: "torch" if isinstance(mod, nn.modules.batchnorm._BatchNorm) else "other"
            for name, mod in model.named_modules() if mod.training and is_batchy(mod)}
