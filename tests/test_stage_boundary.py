"""What crosses a pipeline stage boundary, on a toy decoder (in-process, no ranks).

The model builds a causal mask and rotary-like angles once, from positions and a buffer, and hands
them to every layer, as Hugging Face decoders do.  Emission gives every stage its own copy of those
ops (sapp/emit/pp/stage_local.py), so stage 0 hands on only the hidden state; a mask built from an input
or a tensor from a random op stays one value and is sent.  The cost model reads the same rule off the
captured graph (sapp/pipeline/boundary.py) and prices what is sent: forward bytes with the data mask,
backward bytes without it (no gradient)."""
import os
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sapp.emit.pp import pipe  # noqa: E402

B, S, H, V = 4, 8, 16, 32


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.o = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, h, mask, ang, noise):
        scores = (self.q(h) @ h.transpose(1, 2)).masked_fill(~mask, -1e9)
        return h + self.o(F.softmax(scores, -1) @ h) * ang.cos().mean(-1, keepdim=True) + noise


class Toy(nn.Module):
    """keep: a (B, S) 0/1 input masking keys (a padding mask, data); noisy: a random tensor shared by
    the layers (built once: every stage must see the same one)."""

    def __init__(self, noisy=False):
        super().__init__()
        self.noisy = noisy
        self.emb = nn.Embedding(V, H)
        self.layers = nn.ModuleList(Layer() for _ in range(2))
        self.head = nn.Linear(H, V)
        self.register_buffer("freq", torch.arange(4.0) / 4, persistent=False)

    def forward(self, ids, keep=None):
        h = self.emb(ids)
        pos = torch.arange(ids.shape[1])
        mask = (pos[None, :] <= pos[:, None])[None].expand(ids.shape[0], -1, -1)    # (B, S, S)
        if keep is not None:
            mask = mask & keep[:, None, :].bool()
        with torch.no_grad():
            ang = pos[:, None].float() * self.freq
        noise = torch.rand(ids.shape[1], H) * 0 if self.noisy else torch.zeros(())
        for layer in self.layers:
            h = layer(h, mask, ang, noise)
        return self.head(h)


def _inputs(keep=False):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (B, S), generator=g)
    k = (torch.arange(S) < S - (torch.arange(B) % 3)[:, None]).long()
    return (ids, k) if keep else (ids,)


def _stage0_out(model, x):
    traced = pipe.trace(model, x, ["layers.1"])
    stages = pipe.stage_modules(traced, [0, 1])
    with torch.no_grad():
        h = stages[0](*x)
        h = h if isinstance(h, tuple) else (h,)
        out = stages[1](*h)
        ref = model(*x)
    assert torch.allclose(out[0] if isinstance(out, (tuple, list)) else out, ref, atol=1e-6)
    return [(tuple(t.shape), t.dtype) for t in h]


def test_position_only_tensors_are_computed_by_each_stage():
    torch.manual_seed(0)
    assert _stage0_out(Toy(), _inputs()) == [((B, S, H), torch.float32)]


def test_a_mask_built_from_an_input_is_sent():
    torch.manual_seed(0)
    sent = _stage0_out(Toy(), _inputs(keep=True))
    assert ((B, S, H), torch.float32) in sent and ((B, S, S), torch.bool) in sent and len(sent) == 2


def test_a_random_tensor_is_sent_not_drawn_again():
    torch.manual_seed(0)
    sent = _stage0_out(Toy(noisy=True), _inputs())
    assert ((S, H), torch.float32) in sent and len(sent) == 2


def _plan(keep, tmp_path):
    from sapp.api import search
    torch.manual_seed(0)
    model = Toy()                   # (on cpu: forward builds its positions on the default device)
    x = _inputs(keep)
    y = torch.randint(0, V, (B, S))

    def loss_fn(out, t):
        return F.cross_entropy(out.reshape(-1, V), t.reshape(-1))
    return search(model, "cpu:gpus=2", global_batch=B, example_inputs=x, loss_fn=loss_fn, targets=y,
                  constraints={"pp": 2, "dp": 1, "tp": 1, "zero": 0, "micro_batches": 2, "schedule": "1f1b"})


@pytest.mark.parametrize("keep", [False, True])
def test_plan_prices_what_the_boundary_sends(keep, tmp_path):
    """Per micro-batch of 2: the hidden state (2, S, H) fp32 both ways; the data mask (2, S, S) bool
    forward only.  The positions' mask and angles are not priced: no stage sends them."""
    plan = _plan(keep, tmp_path)
    pp = plan["pipeline"]
    mbs = pp["micro_batch_size"]
    hidden = mbs * S * H * 4
    assert pp["boundary_bytes"] == hidden + (mbs * S * S if keep else 0)
    assert pp.get("boundary_grad_bytes", pp["boundary_bytes"]) == hidden
    assert any("cross forward only" in n for n in plan["notes"]) == keep


def test_side_tensors_of_the_captured_graph():
    from sapp.capture import capture
    from sapp.pipeline.boundary import carries_grad, side_tensors
    from sapp.pipeline.units import split_units
    torch.manual_seed(0)
    g = capture(Toy(), _inputs(keep=True))
    units = split_units(g)
    found = dict(zip([u.name for u in units], side_tensors(g, units)))
    names, crosses = found["layers.0"]
    assert crosses and len(names) == 1                         # the data mask beside the hidden state
    mask = g.nodes[names[0]]
    assert mask.out.dtype == "bool" and mask.out.shape == (B, S, S) and names[0] not in carries_grad(g)
    assert found["layers.1"] == ([], True)                     # nothing after it reads the mask
