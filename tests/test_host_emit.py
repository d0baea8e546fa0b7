"""Host placement emission (sapp/emit/host/host.py) on CPU: "device" is the CPU too, so these tests assert
where tensors and optimizer states live, which optimizer owns which parameter, and that training
with host placement computes the same losses as the plain model.

Equivalences used (exact math, checked within fp32 tolerance):
  * lazy (sparse) Adam == dense Adam when every row of a table is touched in every step (both keep
    the same moments and step count; torch's SparseAdam applies eps after the bias correction of v,
    Adam before, which moves results by ~eps/sqrt(v): far below the tolerance);
  * sparse FTRL == dense FTRL under the same condition (same per-coordinate update);
  * optimizer offload == plain Adam (same Adam math on an fp32 master copy)."""
import copy

import pytest
import torch
from torch import nn

import sapp.models as models
from sapp.emit.host import host
from sapp.errors import PlanError

SECTION = {"groups": {"deep_emb.weight": {"weights": "host", "grads": "host", "optimizer": "host",
                                          "optimizer_kind": "sparse_adam"},
                      "wide_emb.*": {"weights": "host", "grads": "host", "optimizer": "host",
                                     "optimizer_kind": "ftrl"}},
           "predicted": {}}
OFFLOAD = {"groups": {"*": {"weights": "device", "grads": "host", "master_weights": "host", "optimizer": "host",
                            "optimizer_kind": "adam"}}, "predicted": {}}


def wd_batches(model, n, rows, fields, dense, seed=0):
    """Batches of `rows` samples in which every field takes every value once: all rows touched."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.stack([torch.randperm(rows, generator=g) for _ in range(fields)], dim=1)
        x = torch.randn(rows, dense, generator=g)
        y = (torch.rand(rows, generator=g) > 0.5).float()
        out.append(((x, ids), y))
    return out


def tiny_wd():
    torch.manual_seed(0)
    return models.get("wide-deep-tiny", device="cpu")


def test_wide_deep_host_tables_match_dense_training():
    m = tiny_wd()
    cfg = m.sapp_spec.config
    ref = copy.deepcopy(m)
    for e in (ref.wide_emb, ref.deep_emb):           # the plain model: dense gradients, dense optimizers
        e.sparse = False
    batches = wd_batches(m, 3, cfg["rows_per_field"], cfg["fields"], cfg["dense"])
    logs = []
    # eps tiny: SparseAdam adds eps after dividing v by its bias correction, Adam before; with the
    # small per-row gradients of a 100-sample mean loss the default 1e-8 would show up (~1e-4).
    host.apply_placement(m, SECTION, "cpu")
    opts = host.build_optimizers(m, SECTION, 1e-2, eps=1e-12, ftrl_lr=0.05, overrides={"wide*": "ftrl"})
    got = host.train_steps(m, SECTION, batches, 6, "cpu", optimizers=opts, log=logs.append)
    # placement and optimizer wiring
    assert isinstance(m.deep_emb, host.HostEmbedding) and isinstance(m.wide_emb, host.HostEmbedding)
    assert m.deep_emb.weight.device.type == "cpu" and m.deep_emb.sparse
    owners = {id(p): (o.sapp_kind, o.sapp_where) for o in opts for g in o.param_groups for p in g["params"]}
    assert owners[id(m.deep_emb.weight)] == ("sparse_adam", "host")
    assert owners[id(m.wide_emb.weight)] == ("ftrl", "host")
    assert owners[id(m.wide_dense.weight)] == ("ftrl", "device")
    assert owners[id(m.deep[0].weight)] == ("adam", "device")
    assert len(owners) == len(list(m.parameters()))
    # reference: same optimizers applied densely
    ropts = [torch.optim.Adam([ref.deep_emb.weight] + list(ref.deep.parameters()), lr=1e-2, eps=1e-12),
             host.SparseFtrl([ref.wide_emb.weight] + list(ref.wide_dense.parameters()), lr=0.05)]
    want = []
    for i in range(6):
        (x, ids), y = batches[i % 3]
        for o in ropts:
            o.zero_grad()
        wide, deep = host.wide_deep_losses(ref, ref(x, ids), y)
        deep.backward()
        assert ref.deep_emb.weight.grad.layout == torch.strided
        for o in ropts:
            o.step()
        want.append((float(wide.detach()), float(deep.detach())))
    for g, (w, d) in zip(got, want):
        assert g["wide_loss"] == pytest.approx(w, abs=2e-5) and g["deep_loss"] == pytest.approx(d, abs=2e-5)
    assert got[-1]["wide_loss"] < got[0]["wide_loss"]
    assert got[0]["deep_loss"] > got[0]["wide_loss"]            # the L2 term
    assert logs[0].startswith("step 1, wide_loss ") and "deep_loss" in logs[0] and "lookup" in logs[0]
    assert {"lookup_s", "optimizer_s"} <= set(got[0]["host"])
    # Adam turns ~1e-9 gradient differences (sparse vs dense summation order) into visible changes on
    # coordinates whose gradient is ~0, so compare the tables as a whole
    diff = (m.deep_emb.weight - ref.deep_emb.weight).norm() / ref.deep_emb.weight.norm()
    assert diff < 1e-3


def test_host_tables_have_sparse_grads_and_lazy_updates():
    m = tiny_wd()
    host.apply_placement(m, SECTION, "cpu")
    opts = host.build_optimizers(m, SECTION, 1e-2, overrides={"wide*": "ftrl"})
    before = m.deep_emb.weight.detach().clone(), m.wide_emb.weight.detach().clone()
    x, ids = models.example_inputs(m, 4)
    ids = ids.clamp(max=9)                         # only rows 0..9 of each field are touched
    y = models.example_targets(m, 4)
    host.wide_deep_losses(m, m(x, ids), y)[1].backward()
    assert m.deep_emb.weight.grad.is_sparse and m.wide_emb.weight.grad.is_sparse
    assert not m.deep[0].weight.grad.is_sparse
    for o in opts:
        o.step()
    touched = torch.zeros(m.deep_emb.num_embeddings, dtype=torch.bool)
    touched[(ids + m.offsets).flatten()] = True
    for w, b in zip((m.deep_emb.weight, m.wide_emb.weight), before):
        assert torch.equal(w[~touched], b[~touched])           # lazy: untouched rows unchanged
        assert not torch.equal(w[touched], b[touched])
    st = next(o for o in opts if o.sapp_kind == "sparse_adam").state[m.deep_emb.weight]
    assert st["exp_avg"].device.type == "cpu" and torch.count_nonzero(st["exp_avg"][~touched]) == 0
    # model.to() keeps host tables on the host
    m.to(torch.float64)
    assert m.deep_emb.weight.dtype == torch.float32 and m.deep[0].weight.dtype == torch.float64


def test_sparse_ftrl_equals_dense_ftrl_when_all_rows_touched():
    torch.manual_seed(1)
    w0 = 0.01 * torch.randn(5, 3)
    a, b = nn.Parameter(w0.clone()), nn.Parameter(w0.clone())
    oa, ob = host.SparseFtrl([a], lr=0.1, l1=1.0, l2=0.001), host.SparseFtrl([b], lr=0.1, l1=1.0, l2=0.001)
    for _ in range(4):
        g = torch.randn(5, 3)
        a.grad = g.clone()
        b.grad = g.to_sparse(1)
        oa.step(), ob.step()
    torch.testing.assert_close(a, b)
    assert 0 < torch.count_nonzero(a) < a.numel()              # l1 zeroes some weights


def test_ftrl_update_by_hand():
    # w0 = 0.5, n0 = 0.1, g = 0.2, lr = 0.1, no regularisation:
    # n = 0.14, sigma = (sqrt(.14) - sqrt(.1)) / .1, z = g - sigma * w0, w = -z / (sqrt(n) / lr)
    import math
    p = nn.Parameter(torch.tensor([0.5]))
    opt = host.SparseFtrl([p], lr=0.1)
    p.grad = torch.tensor([0.2])
    opt.step()
    sigma = (math.sqrt(0.14) - math.sqrt(0.1)) / 0.1
    z = 0.2 - sigma * 0.5
    assert float(p.detach()) == pytest.approx(-z / (math.sqrt(0.14) / 0.1), rel=1e-6)


def test_placement_errors():
    m = tiny_wd()
    bad = {"groups": {"deep.0.weight": SECTION["groups"]["deep_emb.weight"]}}
    with pytest.raises(PlanError, match="not an nn.Embedding"):
        host.apply_placement(m, bad, "cpu")
    with pytest.raises(PlanError, match="optimizer_kind"):
        host.apply_placement(m, {"groups": {"deep_emb.weight": {"weights": "host", "optimizer_kind": "lion"}}}, "cpu")
    g = models.get("gpt-tiny", device="cpu", tie_embeddings=True)
    with pytest.raises(PlanError, match="tied"):
        host.apply_placement(g, {"groups": {"embed.tok.weight": SECTION["groups"]["deep_emb.weight"]}}, "cpu")


def _gpt_batches(model, n, batch=4):
    return [((models.example_inputs(model, batch)[0].roll(i, 0),), models.example_targets(model, batch).roll(i, 0))
            for i in range(n)]


@pytest.mark.parametrize("stream", [False, True])
def test_optimizer_offload_matches_plain_adam(stream):
    torch.manual_seed(0)
    m = models.get("gpt-tiny", device="cpu", dropout=0.0)
    ref = copy.deepcopy(m)
    batches = _gpt_batches(m, 3)
    opts = host.build_optimizers(host.apply_placement(m, OFFLOAD, "cpu"), OFFLOAD, 1e-3, stream_grads=stream)
    assert len(opts) == 1 and isinstance(opts[0], host.OffloadAdam) and opts[0].sapp_where == "host"
    got = host.train_steps(m, OFFLOAD, batches, 6, "cpu", optimizers=opts, log=None)
    ropt = torch.optim.Adam(ref.parameters(), lr=1e-3)
    lf = models.loss_fn(ref)
    want = []
    for i in range(6):
        (ids,), y = batches[i % 3]
        ropt.zero_grad()
        loss = lf(ref(ids), y)
        loss.backward()
        ropt.step()
        want.append(float(loss.detach()))
    assert [g["loss"] for g in got] == pytest.approx(want, abs=1e-5)
    off = opts[0]
    assert all(mp.dtype == torch.float32 and mp.device.type == "cpu" for mp in off.masters)
    st = off.inner.state[off.masters[0]]
    assert st["exp_avg"].device.type == "cpu" and not off.state      # moments live with the masters
    assert {"offload_d2h_s", "optimizer_s", "offload_h2d_s"} <= set(got[0]["host"])
    if stream:   # streamed: no gradient stays on the device after backward
        lf(m(batches[0][0][0]), batches[0][1]).backward()
        assert all(p.grad is None for p in m.parameters())


def test_offload_keeps_fp32_masters_for_bf16_device_weights():
    torch.manual_seed(0)
    m = models.get("gpt-tiny", device="cpu", dropout=0.0).to(torch.bfloat16)
    opts = host.build_optimizers(m, OFFLOAD, 1e-3)
    w0 = m.head.weight.detach().clone()
    (ids,), y = _gpt_batches(m, 1)[0]
    models.loss_fn(m)(m(ids).float(), y).backward()
    opts[0].step()
    assert m.head.weight.dtype == torch.bfloat16 and opts[0].masters[-1].dtype == torch.float32
    assert not torch.equal(m.head.weight, w0)
    torch.testing.assert_close(m.head.weight, opts[0].masters[-1].to(torch.bfloat16))


def test_emitted_program_runs_host_placement():
    """sapp.emit(model, plan) with a placement section (single process): the program's modules hold
    host tables, its optimizers are ours, and its losses equal training the placed model directly."""
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from sapp.emit import emit
    from tests.emit_workers.plans import make_plan
    m = tiny_wd()
    ref = copy.deepcopy(m)
    cfg = m.sapp_spec.config
    batches = wd_batches(m, 2, cfg["rows_per_field"], cfg["fields"], cfg["dense"])
    prog = emit(m, make_plan(placement_groups=SECTION["groups"]), rank=0, world=1, device="cpu", lr=1e-2)
    mod = prog.modules[0]
    inner = getattr(mod, "module", mod)
    assert isinstance(inner.deep_emb, host.HostEmbedding)
    assert sorted(o.sapp_kind for o in prog.optimizers) == ["adam", "ftrl", "sparse_adam"]
    got = [prog.step(*batches[i % 2]) for i in range(5)]
    host.apply_placement(ref, SECTION, "cpu")
    opts = host.build_optimizers(ref, SECTION, 1e-2)
    want = []
    for i in range(5):
        (x, ids), y = batches[i % 2]
        for o in opts:
            o.zero_grad(set_to_none=True)
        loss = models.loss_fn(ref)(ref(x, ids), y)
        loss.backward()
        for o in opts:
            o.step()
        want.append(float(loss.detach()))
    assert got == pytest.approx(want, abs=1e-6)


def test_sections_from_the_cost_model_run():
    """What placement_options writes is what apply_placement/build_optimizers read: the combined
    option on captured wide-deep-tiny trains with host tables + an offloaded dense optimizer."""
    from sapp.capture import capture
    from sapp.cluster import Cluster
    from sapp.costmodel import CostSettings
    from sapp.placement import placement_options
    g = capture(models.get("wide-deep-tiny"), batch=8)
    opts = {o.name: o for o in placement_options(g, list(g.nodes), Cluster.parse("cpu:gpus=1"), CostSettings())}
    section = opts["embedding+optimizer-host"].section
    m = tiny_wd()
    cfg = m.sapp_spec.config
    host.apply_placement(m, section, "cpu")
    optim = host.build_optimizers(m, section, 1e-2)
    assert sorted((o.sapp_kind, o.sapp_where) for o in optim) == [("adam", "host"), ("ftrl", "host"), ("sparse_adam", "host")]
    off = next(o for o in optim if isinstance(o, host.OffloadAdam))
    assert {id(p) for p in off.device_params} == {id(p) for n, p in m.named_parameters() if not n.endswith("_emb.weight")}
    logs = host.train_steps(m, section, wd_batches(m, 1, cfg["rows_per_field"], cfg["fields"], cfg["dense"]), 4, "cpu",
                            optimizers=optim, log=None)
    assert logs[-1]["wide_loss"] < logs[0]["wide_loss"]
