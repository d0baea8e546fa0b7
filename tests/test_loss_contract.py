"""One loss contract for capture and training: `loss_fn(logits, targets)`, the model's output reduced
by `sapp.models.data.logits_of` in both places.  An HF causal LM returns a CausalLMOutputWithPast;
capture used to hand it to loss_fn raw while training handed it the logits, so a loss written for
tensors failed at search time and one written for the ModelOutput failed at run time."""
import os
import sys

import pytest
import torch
from torch.nn import functional as F

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.emit_workers import hf_models  # noqa: E402


def strict_loss(logits, target):
    """A loss written for the contract: it refuses anything but the logits tensor."""
    assert torch.is_tensor(logits), f"loss_fn got {type(logits).__name__}, not the logits"
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))


def test_search_and_training_call_the_loss_on_logits():
    from sapp.api import search
    from sapp.emit import emit
    meta, _ = hf_models.build("llama", device="meta")
    x, y = hf_models.batch("llama", 4, 0)
    plan = search(meta, "cpu:gpus=1", global_batch=4, example_inputs=x, loss_fn=strict_loss, targets=y)
    model, _ = hf_models.build("llama")
    prog = emit(model, plan, loss_fn=strict_loss, example_inputs=x, check_fingerprint=False)
    got = prog.step(x, y)
    ref_model, _ = hf_models.build("llama")
    assert got == pytest.approx(strict_loss(ref_model(*x).logits, y).item(), rel=1e-6)


def test_capture_puts_the_loss_of_the_logits_in_the_graph():
    from sapp.capture import capture
    meta, _ = hf_models.build("llama", device="meta")
    x, y = hf_models.batch("llama", 4, 0)
    g = capture(meta, x, loss_fn=strict_loss, target=y)
    loss = [n for n in g.nodes.values() if n.kind == "loss"]
    assert loss and loss[0].operands[0].shape[-1] == hf_models.VOCAB
