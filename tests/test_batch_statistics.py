"""A model normalising by batch statistics (BatchNorm) computes other values on a micro-batch than one
process on the whole batch: RegNet tp2 with 8 gradient-accumulation steps trained 2.8e-1 off with no
error.  emit refuses such a plan in one line before anything runs; dp is synced (a torch BatchNorm in
a whole module, emit/dp/batch_stats.py, tests/test_batch_norm_sync.py), and a plan that keeps the whole
batch on every rank, or a model in eval mode, passes."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from sapp.emit.checks import plan as checks
from sapp.errors import PlanError
from tests.emit_workers.plans import make_plan


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.bn(self.conv(x)).mean((2, 3)))


class OwnBatchNorm(nn.Module):
    """A batch norm of its own (no torch BatchNorm class), keeping running statistics as HF's do."""

    def __init__(self, n):
        super().__init__()
        self.momentum = 0.1
        self.register_buffer("running_mean", torch.zeros(n))

    def forward(self, x):
        return x - x.mean(0)


def test_batch_norm_split_batch_refused_in_one_line():
    """What the emitter cannot make equal to one process: a micro-batch's statistics (gradient
    accumulation or a pipeline's micro-batches), dp inside a traced pipeline stage."""
    m = ConvNet()
    for kw in ({"micro_batches": 8}, {"dp": 2, "micro_batches": 2},
               {"pp": 2, "schedule": "gpipe", "micro_batches": 2, "split_before": ("head",)},
               {"pp": 2, "dp": 2, "schedule": "gpipe", "micro_batches": 1, "split_before": ("head",)}):
        with pytest.raises(PlanError) as e:
            checks.check_batch_statistics(m, make_plan(global_batch=8, **kw))
        msg = str(e.value)
        assert "\n" not in msg and "'bn' (BatchNorm2d)" in msg and "micro_batches=1" in msg


def test_batch_statistics_whole_batch_synced_or_eval_pass():
    m = ConvNet()
    checks.check_batch_statistics(m, make_plan(global_batch=8, tp=2))          # every rank sees the batch
    checks.check_batch_statistics(m, make_plan(global_batch=8, dp=2))          # synced over dp (emit/dp/batch_stats.py)
    checks.check_batch_statistics(m, make_plan(global_batch=8, pp=2, schedule="gpipe", micro_batches=1,
                                               split_before=("head",)))       # one micro-batch: the batch
    checks.check_batch_statistics(m.eval(), make_plan(global_batch=8, dp=2, micro_batches=2))   # running statistics
    with pytest.raises(PlanError, match="OwnBatchNorm"):                      # no torch BatchNorm: not synced
        checks.check_batch_statistics(nn.Sequential(OwnBatchNorm(3)), make_plan(global_batch=8, dp=2))
    checks.check_batch_statistics(nn.Sequential(nn.LayerNorm(3)), make_plan(global_batch=8, dp=2, micro_batches=2))


class Branchy(nn.Module):
    """Blocks for a pipeline, and a BatchNorm in a branch the example inputs do not take (Granite
    Speech's audio encoder runs only with audio features): the captured graph has no batch norm."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
        self.audio = nn.Sequential(nn.Conv1d(16, 16, 1), nn.BatchNorm1d(16))
        self.head = nn.Linear(16, 32)

    def forward(self, ids, feats=None):
        h = self.emb(ids)
        if feats is not None:
            h = h + self.audio(feats).transpose(1, 2)
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return self.head(h)


def _search(model, constraints):
    import sapp
    from sapp.api import search
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 32, (8, 5), generator=g)
    y = torch.randint(0, 32, (8, 4), generator=g)
    return search(model, sapp.Cluster.parse("cpu:gpus=2"), global_batch=8, example_inputs=(ids[:, :4],),
                  loss_fn=lambda o, t: nn.functional.cross_entropy(o.reshape(-1, 32), t.reshape(-1)),
                  targets=y, constraints=constraints)


def test_batch_norm_the_example_does_not_run_plans_one_micro_batch():
    # the emitter refuses by the module tree (any train-mode batch norm under a split batch), so the
    # search plans by it too: pp2 with one micro-batch, which the emitter's check passes (it planned
    # two micro-batches, refused at emit, before capture recorded the module)
    from sapp.api import capture_graph
    m = Branchy()
    ids = torch.zeros(8, 4, dtype=torch.long)
    graph, _ = capture_graph(m, (ids,))
    assert not any(n.extra.get("batch_stats") for n in graph.nodes.values())
    assert graph.meta["batch_stat_modules"] == {"audio.1": "torch"}
    plan = _search(m, {"pp": 2, "dp": 1, "tp": 1})
    assert plan.pipeline["micro_batches"] == 1
    checks.check_batch_statistics(m, plan)


def test_batch_norm_of_its_own_class_plans_dp_1():
    # a layer keeping running statistics that is no torch BatchNorm cannot be synced over dp: the
    # search keeps the batch whole on every rank (the emitter refuses dp=2 for it)
    m = nn.Sequential(nn.Linear(16, 16), OwnBatchNorm(16), nn.Linear(16, 32))
    import sapp
    from sapp.api import search
    from sapp.errors import ConstraintError
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 32, (8,))
    kw = dict(global_batch=8, example_inputs=(x,), loss_fn=nn.functional.cross_entropy, targets=y)
    plan = search(m, sapp.Cluster.parse("cpu:gpus=2"), **kw)
    assert plan.parallel["dp"] == 1
    checks.check_batch_statistics(m, plan)
    with pytest.raises(ConstraintError, match="dp must be 1"):
        search(m, sapp.Cluster.parse("cpu:gpus=2"), constraints={"dp": 2}, **kw)
