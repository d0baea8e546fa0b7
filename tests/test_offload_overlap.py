"""Optimizer offload as priced (sapp/placement/cost.py): with dp = 1 each parameter group's CPU Adam runs
during the step's last backward, as soon as the group's gradients are final, and the result equals one
Adam step over every parameter (same kernel, same gradients).  With dp > 1 the emitted OffloadAdam steps
after backward and the price says so."""
from __future__ import annotations

import copy

import pytest
import torch

import sapp.models as models
from sapp.cluster import Cluster
from sapp.costmodel import CostSettings
from sapp.emit.host import host
from sapp.placement import optimizer_offload_cost

OFFLOAD = {"groups": {"*": {"weights": "device", "grads": "host", "master_weights": "host", "optimizer": "host",
                            "optimizer_kind": "adam"}}, "predicted": {}}
BLOCKS = ["layers.0", "layers.1"]


def _batches(model, n, batch=4):
    return [(models.example_inputs(model, batch)[0].roll(i, 0), models.example_targets(model, batch).roll(i, 0))
            for i in range(n)]


def _chunks(batch, m):
    ids, y = batch
    return list(zip(ids.chunk(m), y.chunk(m)))


@pytest.mark.filterwarnings("ignore:Full backward hook")
@pytest.mark.parametrize("m", [1, 2])
def test_per_group_adam_in_last_backward_equals_one_adam_step(m):
    torch.manual_seed(0)
    model = models.get("gpt-tiny", device="cpu", dropout=0.0)
    ref = copy.deepcopy(model)
    (opt,) = host.build_optimizers(model, OFFLOAD, 1e-3, overlap={"accumulations": m, "blocks": BLOCKS})
    assert opt.overlap and len(opt.groups) == 2 + 5       # the two blocks; embed x2, ln_f x2, head alone
    ropt = torch.optim.Adam(ref.parameters(), lr=1e-3, fused=True)    # the kernel OffloadAdam runs
    lf = models.loss_fn(model)
    head_changed_before_embed_grad = []

    def probe(_mod, _gin, _gout):          # the embedding's backward comes last in the pass
        head_changed_before_embed_grad.append(not torch.equal(model.head.weight, before))

    h = model.embed.tok.register_full_backward_hook(probe)
    for batch in _batches(model, 3):
        before = model.head.weight.detach().clone()
        for i, (ids, y) in enumerate(_chunks(batch, m)):
            (lf(model(ids), y) / m).backward()
            if i < m - 1:      # earlier micro-batches only accumulate on the host
                assert not opt._stepped and torch.equal(model.head.weight, before)
        assert len(opt._stepped) == len(opt.groups)          # every group stepped inside backward
        opt.step()
        for ids, y in _chunks(batch, m):
            (lf(ref(ids), y) / m).backward()
        ropt.step()
        ropt.zero_grad()
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            assert torch.equal(p, q), n
    h.remove()
    # the head's update (its group steps first in backward) is visible before the embedding's gradient
    assert head_changed_before_embed_grad[-1] is True


def test_groups_follow_blocks_and_late_parameters_wait_for_step():
    torch.manual_seed(0)
    model = models.get("gpt-tiny", device="cpu", dropout=0.0)
    ref = copy.deepcopy(model)
    (opt,) = host.build_optimizers(model, OFFLOAD, 1e-3,
                                   overlap={"accumulations": 1, "blocks": BLOCKS, "late": ["head.weight"]})
    names = [n for n, _ in model.named_parameters()]
    grouped = [[names[i] for i in g] for g in opt.groups]
    assert [n for n in names if n.startswith("layers.0.")] in grouped
    assert [n for n in names if n.startswith("layers.1.")] in grouped
    assert all("head.weight" not in g for g in grouped)
    ropt = torch.optim.Adam(ref.parameters(), lr=1e-3, fused=True)
    lf = models.loss_fn(model)
    ids, y = _batches(model, 1)[0]
    before = model.head.weight.detach().clone()
    lf(model(ids), y).backward()
    assert torch.equal(model.head.weight, before) and model.head.weight.grad is not None   # late: kept for step()
    opt.step()
    lf(ref(ids), y).backward()
    ropt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)


def test_offload_price_follows_what_runs():
    v100 = Cluster.parse("v100-32g:devices=1")
    S = CostSettings(precision="fp16-mixed")
    n = 1e9
    one = optimizer_offload_cost(n, v100, S, groups=10, compute_s=100.0)
    o = one.detail
    # a long backward hides the worker's Adam + weight copy but for the last group's; the gradient
    # copies leave from backward's hooks and lengthen it (as measured on an H200, bench/gpu_offload.py)
    assert o["pipelined"] and one.exposed_s == pytest.approx(o["d2h_s"] + (o["optimizer_s"] + o["h2d_s"]) / 10)
    short = optimizer_offload_cost(n, v100, S, groups=10, compute_s=0.3).detail
    worker = short["optimizer_s"] + short["h2d_s"]         # one thread: Adam, then the copy back, in series
    assert optimizer_offload_cost(n, v100, S, groups=10, compute_s=0.3).exposed_s == pytest.approx(
        short["d2h_s"] + worker - 0.8 * (2 / 3) * 0.3 + worker / 10)
    cpu = optimizer_offload_cost(n, Cluster.parse("cpu:gpus=1"), S, groups=10, compute_s=100.0)
    assert cpu.exposed_s == pytest.approx(cpu.host_s)      # a CPU device runs it inline in backward
    dp = optimizer_offload_cost(n, v100, S, groups=10, compute_s=100.0, dp=2, zero=0, micro_batches=4)
    t = dp.detail
    # after backward: one gradient copy, Adam, the weight copy, all exposed; gradients stay on the device
    assert not t["pipelined"] and dp.exposed_s == pytest.approx(t["d2h_s"] + t["optimizer_s"] + t["h2d_s"])
    assert dp.overlap_s == 0.0 and dp.saved_bytes == pytest.approx(12 * n)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the asynchronous path (pinned copies, events, a worker "
                    "thread) runs only with a CUDA device")
@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_cuda_async_overlap_equals_offload_after_backward():
    """On a GPU the overlapped OffloadAdam copies gradients asynchronously into pinned buffers and steps
    each group on a worker thread during backward; it must give the same weights, bit for bit, as the
    same CPU Adam run after backward (same device gradients, same kernel)."""
    torch.manual_seed(0)
    model = models.get("gpt-tiny", device="cuda", dropout=0.0)
    ref = copy.deepcopy(model)
    (opt,) = host.build_optimizers(model, OFFLOAD, 1e-3, overlap={"accumulations": 2, "blocks": BLOCKS})
    (ropt,) = host.build_optimizers(ref, OFFLOAD, 1e-3)
    assert opt._async and not ropt.overlap
    lf = models.loss_fn(model)
    for batch in _batches(model, 3):
        for net, o in ((model, opt), (ref, ropt)):
            for ids, y in _chunks(batch, 2):
                (lf(net(ids.cuda()), y.cuda()) / 2).backward()
            o.step()
            o.zero_grad()
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            assert torch.equal(p, q), n
