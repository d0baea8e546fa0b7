"""The built-in model zoo: GPT sizes (gpt-tiny .. gpt3-175b), Llama 3 (llama-tiny, llama3-8b/70b/405b), BERT, ResNet-50, Wide&Deep, MLP.

    model = sapp.models.get("gpt3-175b")              # meta device: no memory is allocated
    model = sapp.models.get("gpt-tiny", device="cpu", dropout=0.0)   # real weights
    x = sapp.models.example_inputs(model, batch=8); y = sapp.models.example_targets(model, 8)
    loss = sapp.models.loss_fn(model)(model(*x), y)

Models return logits; the loss is separate (pipeline emission needs the split).  `WithLoss` bundles
both so capture records the loss op.  Loss conventions: GPT next-token cross-entropy over the
vocabulary at every position; BERT MLM cross-entropy over the vocabulary at every position;
ResNet / MLP classification cross-entropy; Wide&Deep BCE-with-logits on a 0/1 click target."""
from __future__ import annotations

from .data import DataSpec
from .registry import BUILDERS, NAMED
from .resolve import Bundle, build
from .zoo import (ModelSpec, class_cross_entropy, click_bce, example_inputs, example_targets, get, info, loss_fn,
                  names, spec_of, token_cross_entropy)

__all__ = ["ModelSpec", "get", "names", "info", "example_inputs", "example_targets", "loss_fn",
           "WithLoss", "spec_of", "build", "Bundle", "DataSpec"]


def __getattr__(name):
    # WithLoss subclasses torch.nn.Module: defined on first use, so `import sapp.models` (zoo names and
    # configs) does not import torch
    if name == "WithLoss":
        from .withloss import WithLoss
        return WithLoss
    raise AttributeError(f"module 'sapp.models' has no attribute {name!r}")
