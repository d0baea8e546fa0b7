"""BatchNorm models (RegNet, MobileViT, CvT, Granite Speech ...) under dp2, pp2 and tp2, equal to one
process.  A train-mode BatchNorm normalises by its batch's statistics: under dp the emitter reduces
them over the dp group (emit/dp/batch_stats.py: torch's SyncBatchNorm on CUDA, our all-reduce module
on CPU), and the search plans one micro-batch a step (a micro-batch's statistics are not the
batch's), 1F1B with one micro-batch running as GPipe.  Compared with one process on a conv + BN
model of ours (BatchNorm2d, and a BatchNorm1d with momentum 0.3): the losses
of 3 Adam steps and every running mean / variance afterwards.  Before this, dp2 / pp2 / tp2 were
refused ("normalises by batch statistics") or, with the check bypassed, dp2 trained on per-rank
statistics.

The same runs again in float64 (model, data and reference: tests/emit_workers/hf_models.default_dtype)
to 1e-10: in float32 a BatchNorm net's few Adam steps amplify the summation order's rounding (the
catalogue's MobileNets differ 4e-2 under dp2 with no bug), in float64 a correct layout agrees to
~1e-15 (measured 4e-16), so only float64 can show a small real difference.  Before, a float64
model lost digits in float32 steps: GlobalBatchNorm's statistics (x.float()), the reported loss, and
OffloadAdam's fp32 masters (the dp2 and pp2 plans offload the optimizer: 2.7e-8 off one process).

The blocks' norms are `BatchNormAct2d`, a BatchNorm2d subclass whose forward also applies its
activation, written as vision libraries write it (F.batch_norm, then the activation): the sync must
keep the subclass's forward.  Replacing the module by a plain synced layer (as torch's
convert_sync_batchnorm does) dropped the activation and trained dp2 to other losses from step 0.""" 
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BATCH, STEPS = 8, 3
CONFIGS = {"dp2": {"dp": 2, "tp": 1, "pp": 1}, "pp2": {"dp": 1, "tp": 1, "pp": 2, "schedule": "1f1b"},
           "tp2": {"dp": 1, "tp": 2, "pp": 1}}
TP_CLUSTER = "cpu:gpus=2,peak_flops=1e8,intra_latency=0,intra_bw=1e15,op_overhead=0,sharded_op_overhead=0"


class BatchNormAct2d(nn.BatchNorm2d):
    """Norm + activation in one module, the way vision model libraries write it: the forward repeats
    _BatchNorm's running-statistics rule, calls F.batch_norm, then applies the activation."""

    def __init__(self, c, momentum=0.1):
        super().__init__(c, momentum=momentum)
        self.act = nn.SiLU()

    def forward(self, x):
        f = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            f = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        x = nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                     self.training, f, self.eps)
        return self.act(x)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = BatchNormAct2d(c)

    def forward(self, x):
        return x + self.bn(self.conv(x))


class BNNet(nn.Module):
    """A conv stem with BatchNorm2d, two residual conv + BN blocks, a linear head with BatchNorm1d
    (momentum 0.3) on the pooled features.  The layers before a BatchNorm have no bias, as in RegNet:
    its gradient is zero up to rounding, and Adam's first steps turn that noise into +-lr updates."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(c)
        self.blocks = nn.ModuleList([Block(c) for _ in range(2)])
        self.fc = nn.Linear(c, 16, bias=False)
        self.fc_bn = nn.BatchNorm1d(16, momentum=0.3)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = torch.relu(self.stem_bn(self.stem(x)))
        for b in self.blocks:
            x = b(x)
        return self.head(torch.relu(self.fc_bn(self.fc(x.mean((2, 3))))))


def build():
    torch.manual_seed(0)
    m = BNNet()
    with torch.no_grad():            # affine parameters away from 1 / 0, so a wrong scale shows
        for n, p in m.named_parameters():
            if "bn" in n:
                p.normal_()
    return m


def data(step):
    g = torch.Generator().manual_seed(100 + step)
    # channel means far from 0 and unequal halves of the batch: per-rank statistics differ
    x = torch.randn(BATCH, 3, 6, 6, generator=g) * 2 + torch.arange(BATCH).view(-1, 1, 1, 1) * 0.5
    return x, torch.randint(0, 5, (BATCH,), generator=g)


def loss_fn(out, y):
    return nn.functional.cross_entropy(out, y)


def running(module) -> dict:
    return {n: v.detach().double().reshape(-1).tolist() for n, v in module.named_buffers()
            if n.endswith(("running_mean", "running_var", "num_batches_tracked"))}


def reference(dtype=None):
    from tests.emit_workers.hf_models import default_dtype
    with default_dtype(dtype):
        return _reference()


def _reference():
    m = build()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    losses = []
    for i in range(STEPS):
        x, y = data(i)
        loss = loss_fn(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, running(m)


def plan_for(config, path):
    from sapp.api import search
    cons = dict(CONFIGS[config], zero=0)
    cluster = TP_CLUSTER if cons["tp"] > 1 else "cpu:gpus=2"
    x, y = data(0)
    plan = search(build(), cluster, global_batch=BATCH, example_inputs=(x,), constraints=cons, loss_fn=loss_fn, targets=y)
    plan.save(path)
    return plan


def _rank(rank, world, cases, out_dir, store):
    """A rank of tests/emit_workers/harness.fork_ranks: each case's losses and the running statistics
    of the BatchNorms this rank holds (a pipeline stage: those of its half), or its error."""
    import torch.distributed as dist
    from datetime import timedelta
    from tests.emit_workers.hf_models import default_dtype
    torch.set_num_threads(1)
    res, code = {}, 0
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
        for config, path, dtype in cases:
            with default_dtype(dtype):
                res[config + (dtype or "")] = _train(path)
        res["layers"] = _layers(rank, world)
        with default_dtype("float64"):
            res["layers_float64"] = _layers(rank, world)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:                 # noqa: BLE001 - reported to the test
        import traceback
        res["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"
        code = 1
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    os._exit(code)


def _train(path) -> dict:
    from sapp.emit import emit
    from sapp.emit.dp.batch_stats import is_synced
    from sapp.plan import Plan
    x0, _ = data(0)
    prog = emit(build(), Plan.load(path), loss_fn=loss_fn, lr=1e-3, example_inputs=(x0,), check_fingerprint=False)
    losses = []
    for i in range(STEPS):
        x, y = data(i)
        losses.append(prog.step(*prog.shard((x,), y)))
    stats = {}
    for mod in prog.modules:
        stats.update(running(mod))
    return {"losses": losses, "running": stats, "notes": prog.notes,
            "sync": sorted({f"{type(mod).__name__}:{is_synced(mod)}" for p in prog.modules for mod in p.modules()
                            if "BatchNorm" in type(mod).__name__})}


LAYERS = (("bn1d-momentum-None-no-affine", nn.BatchNorm1d, dict(num_features=6, momentum=None, affine=False), (8, 6)),
          ("bn1d-3d-input", nn.BatchNorm1d, dict(num_features=6, momentum=0.2), (8, 6, 5)),
          ("bn-act-subclass", BatchNormAct2d, dict(c=6, momentum=None), (8, 6, 3, 3)))


def _layers(rank, world) -> dict:
    """A synced norm alone over the ranks against one process's on the whole batch: 3 training
    forwards (running statistics; momentum None is the cumulative average) and the input gradient
    of the last, for this rank's rows.  Then world size 1: a group of one changes no output bit."""
    import torch.distributed as dist
    from sapp.emit.dp.batch_stats import is_synced, sync_batch_norms
    out = {}
    for name, cls, kw, shape in LAYERS:
        torch.manual_seed(1)
        ref = nn.Sequential(cls(**kw))
        torch.manual_seed(1)
        mine = nn.Sequential(cls(**kw))
        assert sync_batch_norms(mine, dist.group.WORLD) == 1
        rows = slice(rank * shape[0] // world, (rank + 1) * shape[0] // world)
        for step in range(3):
            g = torch.Generator().manual_seed(step)
            x = torch.randn(*shape, generator=g) * 3 + 1
            w = torch.randn(*shape, generator=g)
            xr, xm = x.clone().requires_grad_(), x[rows].clone().requires_grad_()
            (ref(xr) * w).sum().backward()
            (mine(xm) * w[rows]).sum().backward()
        grad_diff = float((xm.grad - xr.grad[rows]).abs().max() / xr.grad.abs().max())
        stat_diff = max(float((a - b).abs().max()) for a, b in zip(ref.buffers(), mine.buffers()))
        out[name] = {"grad_diff": grad_diff, "stat_diff": stat_diff,
                     "type": f"{type(mine[0]).__name__}:{isinstance(mine[0], cls)}:{is_synced(mine[0])}"}
    solo, plain = BatchNormAct2d(6), BatchNormAct2d(6)
    sync_batch_norms(solo, _own_group(rank, world))
    x = torch.randn(8, 6, 3, 3, generator=torch.Generator().manual_seed(7)) * 2 + 1
    out["world1_equal"] = bool(torch.equal(solo(x), plain(x)) and all(
        torch.equal(a, b) for a, b in zip(solo.buffers(), plain.buffers())))
    return out


def _own_group(rank, world):
    """A group of this rank alone (new_group is collective: every rank creates every group)."""
    import torch.distributed as dist
    groups = [dist.new_group([r]) for r in range(world)]
    return groups[rank]


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """{config: (plan path, plan dict)}, searched once for the module's tests."""
    tmp = tmp_path_factory.mktemp("bn_plans")
    out = {}
    for c in CONFIGS:
        path = str(tmp / f"{c}.json")
        out[c] = (path, plan_for(c, path)._d)
    return out


def test_search_plans_one_micro_batch_and_prices_the_sync(plans):
    """What the search plans for a BatchNorm model: one micro-batch a step under every layout (the
    free tp2 search chose 8 accumulation steps before), and the statistics' all-reduces priced under
    dp (2 per BatchNorm: forward and backward)."""
    from sapp.costmodel.batchstats import batch_stats_sync_time
    from sapp.cluster import Cluster
    plans = {c: d for c, (_, d) in plans.items()}
    for c, p in plans.items():
        assert p["pipeline"]["micro_batches"] == 1, (c, p["pipeline"])
    assert plans["pp2"]["pipeline"]["schedule"] == "1f1b"
    kinds = plans["dp2"]["predicted"]["comm_by_kind"]
    cl = Cluster.parse("cpu:gpus=2")
    want = batch_stats_sync_time((8, 8, 8, 16), 2, "intra", cl)
    assert want > 0 and abs(kinds["batch_stats_sync"] - want) <= 1e-5 * want   # (6 digits in the plan)
    assert "batch_stats_sync" not in plans["tp2"]["predicted"]["comm_by_kind"]


def test_pins_that_split_the_statistics_refused_in_one_line():
    from sapp.api import search
    from sapp.errors import ConstraintError
    x, y = data(0)
    for cons, why in (({"micro_batches": 2}, "micro_batches must be 1"),
                      ({"dp": 2, "pp": 2}, "pp > 1 runs with dp = 1")):
        with pytest.raises(ConstraintError) as e:
            search(build(), "cpu:gpus=4" if "pp" in cons else "cpu:gpus=1", global_batch=BATCH,
                   example_inputs=(x,), constraints=cons, loss_fn=loss_fn, targets=y)
        assert why in str(e.value) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def per_rank(plans):
    """{rank: its results} of one forked job: every layout in float32 and in float64."""
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(c, path, dtype) for dtype in (None, "float64") for c, (path, _) in plans.items()]
        with open(os.path.join(tmp, "cases.json"), "w") as f:
            json.dump(cases, f)
        out = os.path.join(tmp, "out.json")
        # a fresh process forks the ranks (not pytest's); a hung collective fails the test
        subprocess.run([sys.executable, "-m", "tests.test_batch_norm_sync", os.path.join(tmp, "cases.json"), out],
                       cwd=ROOT, timeout=200, check=False, env=dict(os.environ, PYTHONPATH=ROOT))
        with open(out) as f:
            got = json.load(f)
    assert len(got) == 2, got
    for r, g in got.items():
        assert "error" not in g, g["error"]
    return got


def _check(per_rank, dtype, tol):
    ref_losses, ref_running = reference(dtype)
    for r, got in per_rank.items():
        for c in CONFIGS:
            g = got[c + (dtype or "")]
            assert len(g["losses"]) == STEPS
            for a, b in zip(g["losses"], ref_losses):
                assert abs(a - b) <= tol * abs(b), (c, dtype, g["losses"], ref_losses)
            if c == "dp2":
                # every norm synced, each keeping its own class (the subclass's activation included)
                assert g["sync"] == ["BatchNorm1d:True", "BatchNorm2d:True", "BatchNormAct2d:True"], g["sync"]
            # every BatchNorm this rank holds (all of them, or its pipeline stage's) has the
            # running statistics one process has: momentum, global count, unbiased variance
            assert g["running"] and (c == "pp2" or set(g["running"]) == set(ref_running)), (c, sorted(g["running"]))
            for n, v in g["running"].items():
                want = ref_running[n]
                assert all(abs(a - b) <= tol * max(1.0, abs(b)) for a, b in zip(v, want)), (c, dtype, n, v, want)
    for r, got in per_rank.items():          # the layer alone: gradients and running statistics
        layers = got["layers" + ("_" + dtype if dtype else "")]
        for name, cls, _, _ in LAYERS:
            g = layers[name]
            assert g["type"] == f"{cls.__name__}:True:True" and g["grad_diff"] <= tol and g["stat_diff"] <= tol, (name, g)
        assert layers["world1_equal"] is True
    # a pipeline's two stages together hold every BatchNorm
    pp = "pp2" + (dtype or "")
    assert set(per_rank["0"][pp]["running"]) | set(per_rank["1"][pp]["running"]) == set(ref_running)


def test_bn_model_dp2_pp2_tp2_equal_one_process(per_rank):
    _check(per_rank, None, 1e-5)


def test_bn_model_in_float64_equals_one_process_to_1e_10(per_rank):
    """The catalogue's float64 re-run (bench/hf_catalogue.py) on a model of ours: dp2 (our
    all-reduced statistics), pp2 and tp2 equal one process in float64 to 1e-10, the bar's ground."""
    _check(per_rank, "float64", 1e-10)


def test_cuda_path_keeps_the_subclass_forward(monkeypatch):
    """The GPU path on CPU: a synced BatchNormAct2d whose input counts as CUDA sends its own
    batch-norm call to torch's SyncBatchNorm function (recorded here, computing the local norm) and
    still applies its activation; the module keeps its class, tensors and names (torch's
    convert_sync_batchnorm would build a plain SyncBatchNorm without the activation)."""
    import torch.distributed as dist
    from torch.nn.modules import _functions
    from sapp.emit.dp import batch_stats
    calls = []

    def fake_sync(x, w, b, rm, rv, eps, momentum, group, world):
        calls.append((rm is bn.running_mean, w is bn.weight, momentum, world))
        return nn.functional.batch_norm(x, rm, rv, w, b, True, momentum, eps)

    monkeypatch.setattr(batch_stats, "_on_cuda", lambda x: True)
    monkeypatch.setattr(_functions.SyncBatchNorm, "apply", fake_sync)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    torch.manual_seed(0)
    bn, ref = BatchNormAct2d(4), BatchNormAct2d(4)
    ref.load_state_dict(bn.state_dict())
    names = [n for n, _ in bn.named_parameters()] + [n for n, _ in bn.named_buffers()]
    assert batch_stats.sync_batch_norms(nn.Sequential(bn), group=object()) == 1
    x = torch.randn(4, 4, 3, 3) * 2 + 1
    assert isinstance(bn, BatchNormAct2d) and batch_stats.is_synced(bn)
    assert names == [n for n, _ in bn.named_parameters()] + [n for n, _ in bn.named_buffers()]
    assert torch.equal(bn(x), ref(x))                  # the activation ran (a plain norm would differ)
    assert calls == [(True, True, 0.1, 2)]
    assert torch.equal(bn.running_mean, ref.running_mean) and int(bn.num_batches_tracked) == 1
    bn.eval()
    bn(x)
    assert len(calls) == 1                             # eval mode: the running statistics, no sync


if __name__ == "__main__":
    from tests.emit_workers.harness import fork_ranks
    with open(sys.argv[1]) as f:
        todo = json.load(f)
    with open(sys.argv[2], "w") as f:
        json.dump(fork_ranks(_rank, 2, todo)[1], f)
