"""Interleaved and DualPipeV schedules on models whose blocks are not all identical (DeepSeek-V3's 3
dense layers before 58 MoE ones, `first_k_dense`): each device is priced over the blocks the real
chunked layout deals it (search/joint/interleave.mixed_stages), re-scoring gives the same step, and
2 gloo processes train as one process in float64."""
import json
import os
import sys

import pytest
import torch

import sapp
from sapp import api
from sapp.pipeline.partition import dualpipev_layout, interleaved_layout
from tests.emit_workers import joblock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU2 = "cpu:gpus=2"
D, H, LAYERS, GB, STEPS = 6, 16, 6, 16, 3


class _Block(torch.nn.Module):
    def __init__(self, dense):
        super().__init__()
        self.fc = torch.nn.Sequential(*[torch.nn.Linear(H, H) for _ in range(3 if dense else 1)])

    def forward(self, h):
        return h + torch.tanh(self.fc(h))


class FirstDense(torch.nn.Module):
    """Two heavier blocks (three linears) before four light ones (one): first_k_dense in small."""

    def __init__(self, dense=2):
        super().__init__()
        self.inp, self.out = torch.nn.Linear(D, H), torch.nn.Linear(H, 1)
        self.layers = torch.nn.ModuleList(_Block(i < dense) for i in range(LAYERS))

    def forward(self, x):
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def _batch(n):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, D, generator=g, dtype=torch.float64)
    return x, (x.sum(1, keepdim=True) ** 2).sin()


def factory():
    """`sapp run --model tests.test_chunked_mixed_blocks:factory`: float64 model, example batch, targets, loss."""
    torch.manual_seed(0)
    x, y = _batch(8)
    return FirstDense().double(), (x,), y, torch.nn.functional.mse_loss


def _priced(sched, v=2, m=4):
    from sapp.costmodel import CostSettings
    from sapp.search.constraints import Constraints
    from sapp.search.joint import Config, SearchContext
    from sapp.search.joint.evaluate import price_config
    model, ex, y, loss = factory()
    g = api.capture_graph(model, ex, loss, y)[0]
    pins = {"pp": 2, "schedule": sched, "micro_batches": m, "virtual_chunks": v}
    ctx = SearchContext(g, sapp.Cluster.parse(CPU2), 8, Constraints.from_dict(pins), CostSettings(), api.tp_search_fn())
    cfg = Config(2, 1, 1, m, 8 // m, sched, v, 0)
    return ctx, price_config(ctx, cfg, ctx.profile(1, 1))


@pytest.mark.parametrize("sched", ["dualpipev", "interleaved"])
def test_offered_and_priced_over_the_blocks_each_device_really_holds(sched):
    ctx, res = _priced(sched)
    assert not ctx.uniform and res is not None
    counts = [len(s.blocks) for s in res.stages]
    layout = (dualpipev_layout if sched == "dualpipev" else interleaved_layout)(counts, 2)
    real, pos = {0: [], 1: []}, 0
    for d, _, n in layout:
        real[d] += ctx.block_names[pos:pos + n]
        pos += n
    fwd = {u.name: f for u, f in zip(res.profile.units, _numbers(ctx, res).fwd)}
    glue = [u.name for u in res.profile.units if u.kind != "block"]
    for st in res.stages:
        assert st.blocks == real[st.index] and st.chunks == [n for d, _, n in layout if d == st.index]
        # the device's forward is its own units' (not a contiguous run's renamed: the heavy blocks
        # are layers.0 and .1, on different devices once dealt)
        assert st.fwd_s == pytest.approx(sum(fwd[n] for n in st.units), rel=1e-12)
        assert set(st.units) - set(glue) == set(real[st.index])
    heavy = [sum(1 for b in st.blocks if b in ("layers.0", "layers.1")) for st in res.stages]
    assert heavy == [1, 1]
    if sched == "dualpipev":      # the head and loss on rank 0
        assert glue[-1] in res.stages[0].units and glue[-1] not in res.stages[1].units


def _numbers(ctx, res):
    from sapp.search.joint.numbers import unit_numbers
    return unit_numbers(ctx, res.profile, res.config)


def test_today_refusal_is_gone_and_the_remaining_one_names_its_cause():
    from sapp.errors import ConstraintError
    x, y = _batch(8)
    kw = dict(global_batch=8, example_inputs=(x.float(),), loss_fn=torch.nn.functional.mse_loss, targets=y.float())
    plan = api.search(FirstDense(), sapp.Cluster.parse(CPU2), constraints={"pp": 2, "schedule": "dualpipev",
                                                                           "micro_batches": 4}, **kw)
    assert plan["pipeline"]["schedule"] == "dualpipev"
    # a stage map still cannot be dealt into the V: the refusal says so, in one line
    with pytest.raises(ConstraintError) as e:
        api.search(FirstDense(), sapp.Cluster.parse(CPU2), constraints={
            "pp": 2, "schedule": "dualpipev", "micro_batches": 4, "stages": {"layers.0": 0, "layers.3": 1}}, **kw)
    assert "stage map" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("sched", ["dualpipev", "interleaved"])
def test_evaluate_rescores_a_zoo_first_k_dense_plan_to_the_same_step(tmp_path, capsys, sched):
    from sapp.commands.cli import main
    out = tmp_path / "p.json"
    extra = ["--virtual-chunks", "2"] if sched == "interleaved" else []
    assert main(["search", "--model", "moe-tiny", "--model-arg", "l=4", "--model-arg", "dense=1", "--cluster", CPU2,
                 "--batch", "8", "--pp", "2", "--schedule", sched, "--micro-batches", "4", "--recompute", "selective",
                 "--out", str(out), *extra]) == 0
    plan = json.loads(out.read_text())
    assert plan["pipeline"]["schedule"] == sched
    capsys.readouterr()
    assert main(["evaluate", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"], rel=1e-5)   # (the plan rounds)


def test_sapp_run_dualpipev_trains_as_one_process_in_float64(tmp_path):
    model, ex, y, loss = factory()
    plan = api.search(model, sapp.Cluster.parse(CPU2), global_batch=GB, example_inputs=ex, loss_fn=loss, targets=y,
                      constraints={"pp": 2, "schedule": "dualpipev", "micro_batches": 4})
    st = sorted(plan["pipeline"]["stages"], key=lambda s: s["index"])
    assert [s["device_stage"] for s in st] == [0, 1, 1, 0]
    assert [b for s in st for b in s["blocks"]] == [f"layers.{i}" for i in range(LAYERS)]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    x, yy = _batch(GB * STEPS)
    torch.save(((x,), yy), tmp_path / "data.pt")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = joblock.run([sys.executable, "-m", "sapp.commands.cli", "run", str(path), "--model",
                     "tests.test_chunked_mixed_blocks:factory", "--steps", str(STEPS), "--data", str(tmp_path / "data.pt"),
                     "--out", str(tmp_path / "out.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "launching 2 process(es)" in p.stdout
    ref_model = factory()[0]
    opt = torch.optim.Adam(ref_model.parameters(), lr=1e-3)
    ref = []
    for k in range(STEPS):
        opt.zero_grad()
        lo = torch.nn.functional.mse_loss(ref_model(x[k * GB:(k + 1) * GB]), yy[k * GB:(k + 1) * GB])
        lo.backward()
        opt.step()
        ref.append(lo.item())
    got = json.loads((tmp_path / "out.json").read_text())["losses"]
    assert len(got) == STEPS and ref[-1] != ref[0]
    assert max(abs(a - b) / abs(b) for a, b in zip(got, ref)) <= 1e-10, (got, ref)


def test_evaluate_keeps_a_per_block_pin_on_its_real_block(tmp_path, capsys, monkeypatch):
    # a chunked plan's pins are read back on the contiguous names (api/from_plan); blocks of several
    # types are priced over the real ones, so the pin must land on the block the plan names
    import sapp.search.joint.single as single
    from sapp.commands.cli import main
    out = tmp_path / "p.json"
    assert main(["search", "--model", "moe-tiny", "--model-arg", "l=4", "--model-arg", "dense=1", "--cluster", CPU2,
                 "--batch", "8", "--pp", "2", "--schedule", "dualpipev", "--micro-batches", "4", "--out", str(out)]) == 0
    seen, score = [], single.score_config

    def spy(*a, **k):
        got = score(*a, **k)
        seen.append(got[1])
        return got
    monkeypatch.setattr(single, "score_config", spy)
    plan = json.loads(out.read_text())
    for blk in ("layers.3", "layers.1"):        # rank 0's second block, rank 1's first
        plan["recompute"] = {"default": "none", "blocks": {blk: "full"}}
        out.write_text(json.dumps(plan))
        capsys.readouterr()
        assert main(["evaluate", str(out), "--json"]) == 0
        full = {b for st in seen[-1].stages for b, pol in st.recompute.items() if pol == "full"}
        assert full == {blk}
        on = next(st for st in seen[-1].stages if blk in st.blocks)
        assert on.recompute_s > 0 and all(st.recompute_s == 0 for st in seen[-1].stages if st is not on)
