"""Tensor-parallel layouts of modules nested where HF architectures put them (issue 26, catalogue rows
that the shape audit refused under tp=2):

- a gate MLP inside a norm (AXK2's gated RMSNorm: y = norm(x); y * sigmoid(fc2(silu(fc1(y))))): fc2
  closes fc1's region (row split) and also opens an invalid one (its output meets the unsplit y).
  The lone-column-split rule (the LM head's) overwrote fc2's row split with a column split, so fc1
  and fc2 were both column-split and the run failed at one rank's shapes;
- an attention whose stored sizes live in a child module (`attention.self`) while the closer sits in
  a sibling (`attention.output.dense`), as BigBird / CvT write it: the local head count must be set
  on the child, not only on the module holding both;
- CvT's `permute(0, 2, 1, 3).contiguous()` over heads: at one local head the permuted tensor is
  already contiguous and no op is recorded; the audit pairs the other ops in order.

Each is checked by the shape audit at one rank's shapes (no processes): before the fixes it refuses."""
import os
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from sapp.emit.checks import shape_audit  # noqa: E402

D, H, R, SEQ, VOCAB, BATCH = 64, 4, 16, 16, 128, 4


class GatedNorm(nn.Module):
    """AXK2GatedRMSNorm's shape: a low-rank MLP inside the norm gates its output."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, R, bias=False), nn.Linear(R, D, bias=False)

    def forward(self, x):
        y = self.norm(x)
        return y * torch.sigmoid(self.fc2(F.silu(self.fc1(y))))


class SelfPart(nn.Module):
    """BigBird's `attention.self`: q/k/v and the sizes the context is reshaped by."""

    def __init__(self):
        super().__init__()
        self.num_attention_heads, self.attention_head_size, self.all_head_size = H, D // H, D
        self.query, self.key, self.value = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (m(x).view(b, t, -1, self.attention_head_size).transpose(1, 2)
                   for m in (self.query, self.key, self.value))
        a = torch.softmax(q @ k.transpose(-1, -2) / self.attention_head_size ** 0.5, dim=-1) @ v
        return a.permute(0, 2, 1, 3).reshape(b, t, self.all_head_size)


class OutputPart(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(D, D)

    def forward(self, a, x):
        return self.dense(a) + x


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.self, self.output = SelfPart(), OutputPart()

    def forward(self, x):
        return self.output(self.self(x), x)


class Block(nn.Module):
    def __init__(self, gated: bool):
        super().__init__()
        self.ln = GatedNorm() if gated else nn.LayerNorm(D)
        self.attention = Attention()
        self.up, self.down = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x):
        x = self.attention(self.ln(x))
        return x + self.down(F.gelu(self.up(x)))


class Net(nn.Module):
    def __init__(self, gated: bool):
        super().__init__()
        self.emb, self.head = nn.Embedding(VOCAB, D), nn.Linear(D, VOCAB)
        self.blocks = nn.Sequential(Block(gated), Block(gated))

    def forward(self, ids):
        return self.head(self.blocks(self.emb(ids)))


def _layout(model, ids, choice_fn):
    """(styles, groups) the search's tp level derives from a choice on the captured graph."""
    from sapp.capture import capture
    from sapp.search import tp_layout
    graph = capture(model, (ids,))
    choice = choice_fn(graph)
    strategies, _, _ = tp_layout.emittable(graph, choice, 2)
    styles, groups, _ = tp_layout.modules(graph, {n: (d,) for n, d in strategies.items()}, [0])
    return styles, groups


def _every_linear_cut(graph):
    """Megatron's pick: every linear column-split (the search's choice may cut fc2 on n as well)."""
    from sapp.search import tp_layout
    return {n: "n" for n in tp_layout.linears(graph)}


@pytest.fixture(scope="module")
def ids():
    torch.manual_seed(0)
    return torch.randint(0, VOCAB, (BATCH, SEQ))


def test_gate_mlp_inside_a_norm_closes_its_region(ids):
    torch.manual_seed(0)
    model = Net(gated=True)
    styles, groups = _layout(model, ids, _every_linear_cut)
    for i in range(2):
        fc1, fc2 = f"blocks.{i}.ln.fc1", f"blocks.{i}.ln.fc2"
        assert styles[fc1] == "colwise" and styles[fc2] == "rowwise", styles
        assert [fc1, fc2] in groups
    notes = []
    # runs at one rank's shapes, every op as the plan implies (refused before the fix: fc2 column-split)
    assert shape_audit.check(model, styles, groups, 2, (ids,), notes) > 0


def test_sizes_in_a_child_module_are_made_local(ids):
    torch.manual_seed(0)
    model = Net(gated=False)
    styles, groups = _layout(model, ids, _every_linear_cut)
    assert styles["blocks.0.attention.self.query"] == "colwise"
    assert styles["blocks.0.attention.output.dense"] == "rowwise"
    notes = []
    assert shape_audit.check(model, styles, groups, 2, (ids,), notes) > 0
    assert any("SelfPart.all_head_size 64 -> 32 on 2 module(s)" in n for n in notes), notes
    assert model.blocks[1].attention.self.all_head_size == D // 2
    # head size is no split size: kept
    assert model.blocks[1].attention.self.attention_head_size == D // H


class TwoHeads(nn.Module):
    """CvtSelfAttention's reshapes: head_dim from two stored sizes, heads joined after a contiguous()."""

    def __init__(self):
        super().__init__()
        self.embed_dim, self.num_heads = D, 2
        self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x):
        b, t, _ = x.shape
        hd = self.embed_dim // self.num_heads
        q, k, v = (m(x).view(b, t, self.num_heads, hd).permute(0, 2, 1, 3) for m in (self.q, self.k, self.v))
        a = torch.softmax(q @ k.transpose(-1, -2) * hd ** -0.5, dim=-1) @ v
        return a.permute(0, 2, 1, 3).contiguous().view(b, t, self.num_heads * hd)


class CvtLike(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.attention = nn.ModuleDict({"attention": TwoHeads(), "output": nn.Linear(D, D)})
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids):
        x = self.emb(ids)
        x = x + self.attention["output"](self.attention["attention"](x))
        return self.head(x)


def test_a_contiguous_that_vanishes_at_one_local_head(ids):
    torch.manual_seed(0)
    model = CvtLike()
    styles, groups = _layout(model, ids, _every_linear_cut)
    assert styles["attention.attention.q"] == "colwise" and styles["attention.output"] == "rowwise", styles
    notes = []
    assert shape_audit.check(model, styles, groups, 2, (ids,), notes) > 0
    assert model.attention["attention"].num_heads == 1 and model.attention["attention"].embed_dim == D // 2
