"""The shape audit (sapp/emit/checks/shape_audit.py): a tensor-parallel plan is captured again at one rank's
layer shapes before any collective, and every op's shape must be the captured one with the plan's
split axis divided.  The planted bug is OPT's: attention that views q/k/v by the head count it stored
at build time, `view(b, -1, self.num_heads, head_dim)`.  Column-sharded, the `-1` absorbs half the
sequence and, with no mask to disagree, training runs on with wrong values."""
import os
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from sapp.emit import emit  # noqa: E402
from sapp.emit.checks import before, shape_audit  # noqa: E402
from sapp.errors import PlanError  # noqa: E402

D, H, SEQ, VOCAB, BATCH = 64, 4, 16, 128, 8
TP_CLUSTER = "cpu:gpus=2,peak_flops=1e8,intra_latency=0,intra_bw=1e15,op_overhead=0,sharded_op_overhead=0"


class StoredHeadsAttention(nn.Module):
    """Written like OPT's attention: the head count and width are stored, q/k/v are viewed with -1
    standing for the sequence and the heads joined back with -1 standing for the width."""

    def __init__(self):
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = D, H, D // H
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.out_proj = nn.Linear(D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, -1, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, -1, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, -1, self.num_heads, self.head_dim).transpose(1, 2)
        a = torch.softmax(q @ k.transpose(-1, -2) / self.head_dim ** 0.5, dim=-1) @ v
        return self.out_proj(a.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(D), StoredHeadsAttention(), nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _ce(out, y):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


@pytest.fixture(scope="module")
def planted():
    from sapp.api import search
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    with torch.device("meta"):
        meta = Net()
    plan = search(meta, TP_CLUSTER, global_batch=BATCH, example_inputs=(ids,), loss_fn=_ce, targets=ids,
                  constraints={"dp": 1, "tp": 2, "pp": 1, "zero": 0})
    assert plan["tp_modules"]["blocks.0.attn.q_proj"] == "colwise"     # the attention is sharded
    return plan, ids


def test_audit_refuses_a_stored_head_count_before_any_step(planted, monkeypatch):
    """The fix off: the audit names the module, the op and both shapes, before any process group
    exists (emit raises before its own 'torch.distributed is not initialised' check)."""
    plan, ids = planted
    monkeypatch.setattr(before, "LOCALISE", False)
    torch.manual_seed(0)
    with pytest.raises(PlanError) as e:
        emit(Net(), plan, rank=0, world=2, example_inputs=(ids,), check_fingerprint=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert "module 'blocks.0.attn', op aten.view.default gives [8, 8, 4, 16]" in msg, msg
    assert "the plan implies [8, 16, 2, 16]" in msg, msg


def test_local_head_count_passes_the_audit(planted):
    """The fix on: num_heads and embed_dim are set to the rank's share (found from the graph's split
    sizes and the module's attributes), the audit passes, and emit goes on to need its process group."""
    plan, ids = planted
    torch.manual_seed(0)
    model = Net()
    with pytest.raises(PlanError, match="torch.distributed is not initialised"):
        emit(model, plan, rank=0, world=2, example_inputs=(ids,), check_fingerprint=False)
    attn = model.blocks[1].attn
    assert (attn.num_heads, attn.embed_dim, attn.head_dim) == (H // 2, D // 2, D // H)


def test_candidates_are_sizes_the_region_splits(planted):
    """Only width/head-count attributes equal to a split size are candidates: head_dim (16, not
    split) is not; neither would a layer counter equal to the head count be."""
    from sapp.capture import capture
    from sapp.emit.checks import plan as checks
    plan, ids = planted
    model = Net()
    model.blocks[0].attn.layer_idx = H
    graph = capture(model, (ids,))
    regions = shape_audit.sharded_regions(graph, checks.tp_modules(plan), checks.tp_groups(plan), 2, model)
    cand = shape_audit.candidates(model, graph, regions, 2)
    assert sorted(cand) == [("StoredHeadsAttention", "embed_dim"), ("StoredHeadsAttention", "num_heads")]
    assert cand[("StoredHeadsAttention", "num_heads")] == [("blocks.0.attn", H), ("blocks.1.attn", H)]


class TransposedLinear(nn.Linear):
    """Falcon's FalconLinear: an nn.Linear subclass computing `x @ self.weight.T` (a matmul, not a
    linear op, in the captured graph)."""

    def forward(self, x):
        y = x @ self.weight.T
        return y if self.bias is None else y + self.bias


class MatmulNet(nn.Module):
    """A Falcon-like block: an MLP of TransposedLinears, then another matmul (a lone LM head)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.up, self.down = TransposedLinear(D, 2 * D, bias=False), TransposedLinear(2 * D, D, bias=False)
        self.head = TransposedLinear(D, VOCAB, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        x = x + self.down(F.gelu(self.up(x)))
        return self.head(x)


def test_stand_ins_keep_the_layer_class_so_the_audit_lines_up():
    """The audit's rank-shaped stand-ins are of the layer's own class: a plain nn.Linear in place of a
    TransposedLinear ran another op, every later node was compared with the next one's shape and
    Falcon's sharded MLP was refused ('gives [8, 16, 96] ... implies [8, 16, 64]')."""
    from sapp.api import search
    from sapp.emit.checks import plan as checks
    from sapp.emit.tp import parallel
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    with torch.device("meta"):
        meta = MatmulNet()
    plan = search(meta, TP_CLUSTER, global_batch=BATCH, example_inputs=(ids,), loss_fn=_ce, targets=ids,
                  constraints={"dp": 1, "tp": 2, "pp": 1, "zero": 0})
    styles, groups = checks.tp_modules(plan), checks.tp_groups(plan)
    assert styles.get("up") == "colwise" and styles.get("down") == "rowwise", styles
    model = MatmulNet()
    local = parallel.local_layers(model, styles, 2, groups)
    assert type(local["up"]) is TransposedLinear and tuple(local["up"].weight.shape) == (D, D)
    assert shape_audit.check(model, styles, groups, 2, (ids,), []) > 0
