"""A split layer's weight read outside the layer (sapp/emit/checks/outside_reads.py) is refused before
any process group, in one line.  The planted read is Gemma 4's: the parent's forward takes one row of
the tied embedding table for a branch whose result it never uses, so the captured graph has no such
read and the search splits the table by vocabulary; the eager step would then stop on DTensor's
"got mixed torch.Tensor and DTensor"."""
import os
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from sapp.emit import emit  # noqa: E402
from sapp.emit.checks import outside_reads  # noqa: E402
from sapp.errors import PlanError  # noqa: E402

D, VOCAB, SEQ, BATCH, PAD = 32, 256, 8, 4, 0
TP_CLUSTER = "cpu:gpus=2,peak_flops=1e8,intra_latency=0,intra_bw=1e15,op_overhead=0,sharded_op_overhead=0"


class TiedNet(nn.Module):
    """An embedding tied to its head; `dead_read` plants the parent's read of the table."""

    def __init__(self, dead_read: bool = False, shape_read: bool = False):
        super().__init__()
        self.dead_read, self.shape_read = dead_read, shape_read
        self.emb = nn.Embedding(VOCAB, D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        x = self.emb(ids)
        if self.dead_read:
            pad = self.emb.weight[PAD, :]
            torch.where((ids == PAD)[..., None], pad.view(1, 1, -1), x)     # result unused, as Gemma 4's
        if self.shape_read:
            assert self.emb.weight.shape[0] == VOCAB and self.emb.weight.dtype == x.dtype
        x = x + self.fc2(F.gelu(self.fc1(x)))
        return self.head(x)


def _ce(out, y):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def _search(model, ids, **constraints):
    from sapp.api import search
    return search(model, TP_CLUSTER, global_batch=BATCH, example_inputs=(ids,), loss_fn=_ce, targets=ids,
                  constraints=dict({"zero": 0}, **constraints))


@pytest.fixture(scope="module")
def plan_and_ids():
    """A tp2 plan searched for the model without the read: the dead read adds nothing to the graph,
    so it is the plan the model with the read would get if the search did not look for it."""
    torch.manual_seed(0)
    ids = torch.randint(1, VOCAB, (BATCH, SEQ))
    with torch.device("meta"):
        meta = TiedNet()
    plan = _search(meta, ids, dp=1, pp=1, tp=2)
    assert plan["tp_modules"].get("emb") == "vocab", plan["tp_modules"]     # split like any tied table
    return plan, ids


def test_the_search_refuses_a_pinned_tp_and_drops_a_free_one(plan_and_ids):
    """The search runs the same check on the plan it is about to return (sapp/emit/runnable.py): pinned
    tp=2 is refused in one line; free, the plan returned does not split the table (sapp/emit/runnable.py
    drops a failing candidate with every configuration of its tp degree)."""
    from sapp.errors import ConstraintError
    _, ids = plan_and_ids
    with torch.device("meta"):
        meta = TiedNet(dead_read=True)
    with pytest.raises(ConstraintError) as e:
        _search(meta, ids, dp=1, pp=1, tp=2)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith("the pinned tp=2 cannot run this model: tensor parallelism tp=2: TiedNet"), e.value
    free = _search(meta, ids, pp=1)
    assert free.parallel["tp"] == 1 and free.parallel["dp"] == 2, free.parallel


def test_dead_read_of_a_split_table_is_refused_before_any_process_group(plan_and_ids):
    plan, ids = plan_and_ids
    with pytest.raises(PlanError) as e:
        emit(TiedNet(dead_read=True), plan, rank=0, world=2, example_inputs=(ids,), check_fingerprint=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert "TiedNet '(model)' reads emb.weight = head.weight (__getitem__) outside the layer" in msg, msg
    assert "pin tp=1 or leave emb, head out of the plan's tp_modules" in msg, msg


def test_metadata_reads_and_the_layers_own_uses_pass(plan_and_ids):
    """The same plan on the model without the read (the shape and dtype of the table are still read
    by the parent) passes the check and goes on to need its process group."""
    plan, ids = plan_and_ids
    with pytest.raises(PlanError, match="torch.distributed is not initialised"):
        emit(TiedNet(shape_read=True), plan, rank=0, world=2, example_inputs=(ids,), check_fingerprint=False)


class FunctionalHead(nn.Module):
    """A live read: the head computed in the parent from the embedding's table."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)

    def forward(self, ids):
        return self.emb(ids) @ self.emb.weight.T


def test_a_live_read_in_the_parent_is_found_and_an_unsplit_table_is_not():
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    found = outside_reads.find(FunctionalHead(), ["emb"], (ids,))
    assert found is not None and found[0] == "(model)" and found[2] == "emb.weight", found
    assert outside_reads.find(FunctionalHead(), [], (ids,)) is None
    # the fake forward writes nothing: the weights are the ones the model had
    net = TiedNet(dead_read=True)
    before = net.emb.weight.detach().clone()
    assert outside_reads.find(net, ["emb", "head"], (ids,))[3] == "__getitem__"
    assert torch.equal(net.emb.weight, before) and net.emb.weight.grad is None


class Caching(nn.Module):
    """A forward that caches on its module, as x-transformers' ALiBi (a buffer registered in forward)
    and HF rotary layers (an attribute) do, and a BatchNorm updating its running statistics."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.norm = nn.BatchNorm1d(D)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, ids):
        x = self.emb(ids)
        if getattr(self, "bias", None) is None or self.bias.shape[0] < ids.shape[1]:
            self.register_buffer("bias", torch.arange(ids.shape[1], dtype=x.dtype), persistent=False)
            self.cached_len = ids.shape[1]
        self.calls += 1
        return self.norm((x + self.bias[:, None]).transpose(1, 2))


def test_what_the_forward_caches_is_put_back():
    """The check's forward on fake tensors leaves no fake tensor, attribute or count on the model:
    a cached fake buffer would meet the real step (DataDependentOutputException)."""
    torch.manual_seed(0)
    net = Caching()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    mean = net.norm.running_mean.clone()
    assert outside_reads.find(net, ["emb"], (ids,)) is None
    assert "bias" not in net._buffers and not hasattr(net, "cached_len")
    assert int(net.calls) == 0 and int(net.norm.num_batches_tracked) == 0
    assert torch.equal(net.norm.running_mean, mean)
    net(ids)                            # the real forward runs and caches as it would have
    assert net.bias.shape == (SEQ,) and int(net.calls) == 1
