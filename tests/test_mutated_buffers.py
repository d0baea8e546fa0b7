"""A buffer the forward writes from the batch (an EMA of activations, not a BatchNorm) under layouts
that split the batch (issue 51, item 1).  Before, batch-statistics detection knew only BatchNorm and
modules with running_mean + momentum: the search planned dp2 for this model, and each rank updated
the EMA from its half of the batch (2.3e-4 off one process after 3 steps, float64 too).  Now capture
reads the buffers the exported program writes (capture/batchy.py: `batch_buffers`), the search keeps
such a model on the whole batch (a free dp dropped, a pinned one refused in one line naming the
buffer), and the emitter refuses a hand-made dp2 plan before the first step."""
from __future__ import annotations

import pytest
import torch
from torch import nn

BATCH = 8


class EMA(nn.Module):
    """Subtracts a running mean of its input's features, updated in forward (torch.no_grad), and
    counts its steps: the count is the same on every rank, the mean is the batch's."""

    def __init__(self, d, update=True):
        super().__init__()
        self.update = update
        self.register_buffer("shadow", torch.zeros(d))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        if self.training and self.update:
            with torch.no_grad():
                self.shadow.mul_(0.9).add_(0.1 * x.mean((0, 1)))
                self.steps.add_(1)
        return x - self.shadow


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class EMANet(nn.Module):
    def __init__(self, d=16, update=True):
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.ema = EMA(d, update)
        self.blocks = nn.ModuleList([Block(d) for _ in range(2)])
        self.bn = nn.BatchNorm1d(d)         # a torch BatchNorm beside it: synced over dp, never named
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        h = self.ema(self.inp(x))
        for b in self.blocks:
            h = b(h)
        return self.head(self.bn(h.transpose(1, 2)).transpose(1, 2))


def data():
    g = torch.Generator().manual_seed(3)
    return torch.randn(BATCH, 5, 8, generator=g), torch.randint(0, 4, (BATCH, 5), generator=g)


def loss_fn(out, y):
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def _search(model, cluster, cons):
    from sapp.api import search
    x, y = data()
    return search(model, cluster, global_batch=BATCH, example_inputs=(x,), constraints=cons, loss_fn=loss_fn,
                  targets=y)


def test_capture_lists_the_buffer_written_from_the_batch():
    """The EMA's mean is listed; its step counter (written from itself) and the BatchNorm's
    statistics (their own rules) are not; a model that writes none lists nothing."""
    from sapp.capture import capture
    x, _ = data()
    assert capture(EMANet(), (x,)).meta.get("batch_buffers") == ["ema.shadow"]
    assert "batch_buffers" not in capture(EMANet(update=False), (x,)).meta


def test_the_capture_cache_carries_the_buffers():
    """The cached graph (JSON data) keeps the list; an entry of the format before it is not read."""
    import json
    from sapp.capture import capture, graph_json
    x, _ = data()
    d = json.loads(json.dumps(graph_json.to_data(capture(EMANet(), (x,)))))
    assert graph_json.from_data(d).meta["batch_buffers"] == ["ema.shadow"]
    with pytest.raises(ValueError):
        graph_json.from_data(dict(d, format=1))


def test_search_keeps_the_whole_batch_and_refuses_a_pinned_dp_in_one_line():
    from sapp.errors import ConstraintError
    plan = _search(EMANet(), "cpu:gpus=2", {})
    assert plan.parallel["dp"] == 1 and (plan.pipeline.get("micro_batches") or 1) == 1, (plan.parallel, plan.pipeline)
    for cons in ({"dp": 2}, {"micro_batches": 2}):
        with pytest.raises(ConstraintError) as e:
            _search(EMANet(), "cpu:gpus=2" if "dp" in cons else "cpu:gpus=1", cons)
        msg = str(e.value)
        assert "'ema.shadow'" in msg and "\n" not in msg, msg
    # the same model without the update gets dp2 (the BatchNorm alone is synced)
    assert _search(EMANet(update=False), "cpu:gpus=2", {"dp": 2}).parallel["dp"] == 2


def test_emit_refuses_a_dp2_plan_before_the_first_step(tmp_path):
    """A dp2 plan (searched for the twin that does not update) run on the EMA model: refused in one
    line naming the buffer, before any process group is needed."""
    from sapp.emit import emit
    from sapp.errors import PlanError
    plan = _search(EMANet(update=False), "cpu:gpus=2", {"dp": 2})
    x, _ = data()
    with pytest.raises(PlanError) as e:
        emit(EMANet(), plan, world=2, rank=0, loss_fn=loss_fn, example_inputs=(x,), check_fingerprint=False)
    msg = str(e.value)
    assert "'ema.shadow'" in msg and "dp=2" in msg and "\n" not in msg, msg


class EMABlock(Block):
    def __init__(self, d, ema):
        super().__init__(d)
        self.ema = ema

    def forward(self, x):
        return super().forward(self.ema(x))


class SharedEMANet(nn.Module):
    """One EMA module held by both blocks (as torchtune holds one rotary module in every layer): a
    pipeline that puts the blocks on two stages gives each stage its own copy of the buffer."""

    def __init__(self, d=16, update=True):
        super().__init__()
        self.inp = nn.Linear(8, d)
        ema = EMA(d, update)
        self.blocks = nn.ModuleList([EMABlock(d, ema) for _ in range(2)])
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def test_a_pipeline_that_copies_a_shared_written_buffer_is_refused():
    """pp2 with one micro-batch splits no batch, but each stage would update its own copy of the
    shared EMA from its own block's input: the emitter's check refuses it in one line naming the
    buffer and its paths (torch's split refuses this model's pp2 too, at search)."""
    from types import SimpleNamespace
    from sapp.emit.checks import buffers
    from sapp.errors import PlanError
    model, x = SharedEMANet(), data()[0]
    graph = SimpleNamespace(meta={"batch_buffers": ["blocks.0.ema.shadow"]})
    plan = SimpleNamespace(parallel={"dp": 1, "tp": 1, "pp": 2}, pipeline={"micro_batches": 1})
    with pytest.raises(PlanError) as e:
        buffers.check(model, plan, (x,), graph)
    msg = str(e.value)
    assert "'blocks.0.ema.shadow'" in msg and "2 blocks share" in msg and "pp=2" in msg and "\n" not in msg, msg
    buffers.check(model, SimpleNamespace(parallel={"dp": 1, "tp": 1, "pp": 1}, pipeline={"micro_batches": 1}),
                  (x,), graph)                      # one stage: one copy, updated as one process does
    buffers.check(EMANet(), plan, (x,), SimpleNamespace(meta={"batch_buffers": ["ema.shadow"]}))  # not shared
    from sapp.errors import SappError
    with pytest.raises(SappError):                  # and the search does not plan it either
        _search(SharedEMANet(), "cpu:gpus=2", {"pp": 2, "micro_batches": 1})
