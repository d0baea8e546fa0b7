"""A model normalising by batch statistics (BatchNorm) computes other values on a micro-batch than one
process on the whole batch: RegNet tp2 with 8 gradient-accumulation steps trained 2.8e-1 off with no
error.  emit refuses such a plan in one line before anything runs; dp is synced (a torch BatchNorm in
a whole module, emit/batch_stats.py, tests/test_batch_norm_sync.py), and a plan that keeps the whole
batch on every rank, or a model in eval mode, passes."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from sapp.emit import checks
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
    checks.check_batch_statistics(m, make_plan(global_batch=8, dp=2))          # synced over dp (emit/batch_stats.py)
    checks.check_batch_statistics(m, make_plan(global_batch=8, pp=2, schedule="gpipe", micro_batches=1,
                                               split_before=("head",)))       # one micro-batch: the batch
    checks.check_batch_statistics(m.eval(), make_plan(global_batch=8, dp=2, micro_batches=2))   # running statistics
    with pytest.raises(PlanError, match="OwnBatchNorm"):                      # no torch BatchNorm: not synced
        checks.check_batch_statistics(nn.Sequential(OwnBatchNorm(3)), make_plan(global_batch=8, dp=2))
    checks.check_batch_statistics(nn.Sequential(nn.LayerNorm(3)), make_plan(global_batch=8, dp=2, micro_batches=2))
