"""Selective recomputation runs what the cost model priced as recomputed: the attention core (q.k^T,
scale, mask, softmax, dropout), no GEMM outside it, found without relying on a child named `attn`.

The independent count: a block's backward without recomputation runs 4 bmm (the gradients of q.k^T
and att.v, two each) and no forward op; with the core recomputed it runs one more bmm (q.k^T again)
and one forward softmax, and no addmm (a recomputed QKV or output projection would show up as one)."""
import os
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import sapp.models as models
from sapp.emit import emit
from sapp.emit.checks import manifest
from sapp.emit.recompute import checkpointing as recompute
from sapp.errors import PlanError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)          # tests/ has no __init__: make `tests.emit_workers` importable
from tests.emit_workers.plans import make_plan  # noqa: E402


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def _plan(model, recompute_default="selective", blocks=None, name="test"):
    return make_plan(name=name, params=sum(p.numel() for p in model.parameters()), global_batch=4,
                     recompute_default=recompute_default, recompute_blocks=blocks)


def _backward_ops(model, x, loss_of):
    torch.manual_seed(7)
    loss = loss_of(model(x))
    with _Count() as c:
        loss.backward()
    return c.ops


def _gpt_pair(dropout):
    torch.manual_seed(0)
    m = models.get("gpt-tiny", device="cpu", dropout=dropout)
    torch.manual_seed(0)
    ref = models.get("gpt-tiny", device="cpu", dropout=dropout)
    return m, ref


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_selective_recomputes_exactly_the_priced_core_and_gradients_are_unchanged(dropout):
    m, ref = _gpt_pair(dropout)
    x = torch.randint(0, 256, (4, 16))
    y = torch.randint(0, 256, (4, 16))
    prog = emit(m, _plan(m, name="gpt-tiny"), rank=0, world=1, example_inputs=(x,))

    def loss_of(out):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    got = _backward_ops(prog.module, x, loss_of)
    base = _backward_ops(ref, x, loss_of)
    n_blocks = 2
    assert got.count("addmm") == 0 == base.count("addmm")          # no QKV / projection GEMM runs again
    assert got.count("bmm") == base.count("bmm") + n_blocks          # q.k^T once more per block
    assert got.count("_softmax") == n_blocks and base.count("_softmax") == 0
    for (n, a), (_, b) in zip(prog.module.named_parameters(), ref.named_parameters()):
        assert torch.equal(a.grad, b.grad), n
    # the manifest says the same: per block one matmul and one softmax, the plan's priced core
    rc = manifest.observed(prog)["recompute"]
    assert manifest.check(prog, runtime=True) == []
    assert rc == {b: {"mode": "selective", "region": f"{b}.attn", "ops": {"matmul": 1, "softmax": 1}}
                  for b in ("layers.0", "layers.1")}


class _Mixer(nn.Module):
    """Attention under a name the old emitter did not look for."""

    def __init__(self, h=32, a=4):
        super().__init__()
        self.a, self.hd = a, h // a
        self.qkv = nn.Linear(h, 3 * h)
        self.out = nn.Linear(h, h)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, self.a, 3 * self.hd).transpose(1, 2).split(self.hd, dim=-1)
        att = F.softmax((q @ k.transpose(-2, -1)) / self.hd ** 0.5, dim=-1)
        return self.out((att @ v).transpose(1, 2).reshape(b, t, -1))


class _Block(nn.Module):
    def __init__(self, h=32):
        super().__init__()
        self.norm = nn.LayerNorm(h)
        self.mixer = _Mixer(h)
        self.ff = nn.Linear(h, h)

    def forward(self, x):
        x = x + self.mixer(self.norm(x))
        return x + self.ff(x)


class _Net(nn.Module):
    def __init__(self, h=32, n=2):
        super().__init__()
        self.inp = nn.Linear(8, h)
        self.blocks = nn.ModuleList(_Block(h) for _ in range(n))
        self.head = nn.Linear(h, 4)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def test_attention_not_named_attn_is_still_recomputed():
    # the old emitter looked for a child named attn/attention/self_attn and silently did nothing
    torch.manual_seed(0)
    m = _Net()
    torch.manual_seed(0)
    ref = _Net()
    x = torch.randn(4, 6, 8)
    prog = emit(m, _plan(m), rank=0, world=1, example_inputs=(x,))

    def loss_of(out):
        return out.pow(2).mean()
    got, base = _backward_ops(prog.module, x, loss_of), _backward_ops(ref, x, loss_of)
    assert got.count("bmm") == base.count("bmm") + 2 and got.count("_softmax") == 2
    assert got.count("addmm") == 0
    assert manifest.check(prog, runtime=True) == []
    assert {b: d["region"] for b, d in prog.manifest["recompute"].items()} == {
        "blocks.0": "blocks.0.mixer", "blocks.1": "blocks.1.mixer"}
    for (n, a), (_, b) in zip(prog.module.named_parameters(), ref.named_parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-6, atol=1e-7), n


def test_block_whose_core_cannot_be_identified_is_refused_or_noted():
    torch.manual_seed(0)
    m = _Net()
    # no example inputs and not a zoo model: capture cannot run, the priced core is unknown
    with pytest.raises(PlanError, match="selective"):
        emit(m, _plan(m), rank=0, world=1)
    prog = emit(_Net(), _plan(m), rank=0, world=1, allow_mismatch=True)
    assert prog.recompute_done == {} and any("MISMATCH" in n and "recompute" in n for n in prog.notes)


def test_block_without_attention_core_is_priced_and_run_as_none():
    # an MLP block has no core: the cost model drops nothing for "selective", so nothing recomputes
    torch.manual_seed(0)
    m = models.get("mlp-tiny", device="cpu")
    x = models.example_inputs(m, 4, "cpu")
    prog = emit(m, _plan(m, name="mlp-tiny"), rank=0, world=1, example_inputs=x)
    assert all(d == {"mode": "selective", "region": None, "ops": {}} for d in prog.manifest["recompute"].values())
    assert prog.manifest["recompute"] and not prog.mismatches
    assert prog.step(x, models.example_targets(m, 4, "cpu")) > 0


def test_policy_core_boundaries_on_gpt_block():
    torch.manual_seed(0)
    m = models.get("gpt-tiny", device="cpu", dropout=0.1)
    x = torch.randint(0, 256, (2, 16))
    modes = recompute.plan_modes({"default": "selective"}, m)
    regions = recompute.priced_regions(m, modes, (x,))
    done = recompute.apply(m, modes, regions)
    m(x).sum().backward()
    core = done["layers.0"]["ops"]
    # from the q.k^T bmm to the dropout's multiply; the .v matmul and the projection are kept
    assert core[0] == "bmm" and core.count("bmm") == 1 and "_softmax" in core and "bernoulli_" in core
    assert "addmm" not in core and "addmm" not in done["layers.0"]["unpriced"]
    assert "bmm" not in done["layers.0"]["unpriced"] and "_softmax" not in done["layers.0"]["unpriced"]
