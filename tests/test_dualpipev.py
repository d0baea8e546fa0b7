"""DualPipeV (torch's ScheduleDualPipeV) as a schedule sapp searches, prices, validates, runs and exports:
the V (rank r holds stages r and 2p - 1 - r, so rank 0 holds the embedding and the head and loss), its
step from the event simulator on the stage times priced, refusals in one line (pp 1, m < 2 pp, too few
blocks, a stage map), re-scoring, 2 gloo processes equal to one process in float64, and
torchtitan 0.2.2's "DualPipeV" to and from sapp (Megatron-LM and DeepSpeed refuse it)."""
import json
import os
import sys

import pytest
import torch

import sapp
import sapp.models as models
from sapp import api
from sapp.errors import ConstraintError, PlanError
from sapp.plan import Plan
from sapp.pipeline.dualpipe import dualpipev_in_flight, rank_of, stage_peak
from sapp.pipeline.schedule import simulate, step_time
from tests.emit_workers import hetero_job, joblock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU2 = "cpu:gpus=2"


def _gpt(layers=4):
    return models.get("gpt-tiny", device="meta", dropout=0.0, l=layers)


def _search(pins, layers=4, gb=8, spec=CPU2, **kw):
    return api.search(_gpt(layers), sapp.Cluster.parse(spec), global_batch=gb, constraints=pins, **kw)


def _priced(pins, layers=4, gb=8, spec=CPU2):
    """(search context, the pinned configuration priced by the joint search's own evaluation)."""
    from sapp.capture import capture
    from sapp.costmodel import CostSettings
    from sapp.search.constraints import Constraints
    from sapp.search.joint import Config, SearchContext
    from sapp.search.joint.evaluate import price_config
    g = capture(_gpt(layers), batch=gb)
    ctx = SearchContext(g, sapp.Cluster.parse(spec), gb, Constraints.from_dict(pins), CostSettings(), api.tp_search_fn())
    p, m = pins["pp"], pins["micro_batches"]
    cfg = Config(p, 1, 1, m, gb // m, pins["schedule"], 2 if pins["schedule"] in ("dualpipev", "interleaved") else 1, 0)
    return ctx, price_config(ctx, cfg, ctx.profile(1, 1))


def test_pinned_step_is_the_simulators_on_the_stage_times():
    pins = {"pp": 2, "schedule": "dualpipev", "micro_batches": 4}
    ctx, res = _priced(pins)
    from sapp.search.joint.stage import StageEvaluator
    st = res.stages
    fw, bw = [s.fwd_s for s in st], [s.bwd_s for s in st]
    ev = StageEvaluator(ctx, res.config, res.profile)
    sends = [tuple(x[0] for x in ev.send_pair(i)) for i in range(2)]     # (forward, backward) seconds of one send
    assert all(s > 0 for s in sends[0])
    sim = simulate(fw, bw, 4, "dualpipev", 2, sends, chunk_shares=[s.chunk_shares for s in st])
    pipe = res.step_time_s - res.grad_sync_s - res.optimizer_s - ctx.loss_sync_s
    assert pipe == pytest.approx(sim.step_s, rel=1e-12)
    # not 1F1B's closed form on the same stage times
    assert abs(step_time(fw, bw, 4, "1f1b", 1, sends) - sim.step_s) > 1e-3 * sim.step_s


def test_sends_follow_the_v():
    # the inner stages p - 1 and p share a rank (no send), the model's last stage (rank 0) sends nothing
    ctx, res = _priced({"pp": 4, "schedule": "dualpipev", "micro_batches": 8}, layers=8, spec="cpu:gpus=4")
    from sapp.search.joint.stage import StageEvaluator
    ev = StageEvaluator(ctx, res.config, res.profile)
    assert [ev.send_counts(i) for i in range(4)] == [(1, 1), (2, 2), (2, 2), (1, 1)]


def test_memory_two_chunks_a_rank_head_and_loss_on_rank_0():
    ctx, dual = _priced({"pp": 2, "schedule": "dualpipev", "micro_batches": 4})
    _, one = _priced({"pp": 2, "schedule": "1f1b", "micro_batches": 4})
    d0, d1 = dual.stages
    head = [u for u in one.stages[1].units if u not in one.stages[1].blocks]
    assert head and set(head) <= set(d0.units) and not set(head) & set(d1.units)
    assert all(u.startswith("layers.") for u in d1.units)      # rank p - 1 holds blocks only
    # each rank holds its 2 chunks' parameters once: together the model's, as under 1F1B (not DualPipe's 2x)
    total = lambda r, k: sum(s.memory[k] for s in r.stages)     # noqa: E731
    for k in ("params", "grads", "optimizer"):
        assert total(dual, k) == pytest.approx(total(one, k), rel=1e-9)
    assert d0.memory["params"] > d1.memory["params"]         # the embedding and the head on rank 0
    # activations: rank 1's blocks at pipeline.dualpipe.in_flight's peak
    infl = dualpipev_in_flight(2, 4)
    assert [s.in_flight for s in dual.stages] == infl
    from sapp.search.joint.stage import StageEvaluator
    ev = StageEvaluator(ctx, dual.config, dual.profile)
    act = {u.name: ev.num.act[j][0] for j, u in enumerate(ev.units)}
    assert d1.memory["activations"] == pytest.approx(infl[1] * sum(act[b] for b in d1.units), rel=1e-9)
    # rank 0: its blocks and embedding at the peak, its head and loss for the last stage's stage_peak
    own = [u for u in d0.units if u not in head]
    want = infl[0] * sum(act[u] for u in own) + stage_peak(2, 4, 3) * sum(act[u] for u in head)
    assert stage_peak(2, 4, 3) == 1 and d0.memory["activations"] == pytest.approx(want, rel=1e-9)


def test_a_tied_head_is_a_copy_on_rank_0_summed_there():
    # GPT-2's tied embedding and head: under DualPipeV both on rank 0, in two stage modules (a copy each,
    # their gradients summed on the rank: emit/pp/pipe.TiedGrads), no all-reduce between ranks
    def priced(schedule):
        from sapp.capture import capture
        from sapp.costmodel import CostSettings
        from sapp.search.constraints import Constraints
        from sapp.search.joint import Config, SearchContext
        from sapp.search.joint.evaluate import price_config
        g = capture(models.get("gpt-tiny", device="meta", dropout=0.0, l=4, tie_embeddings=True), batch=8)
        ctx = SearchContext(g, sapp.Cluster.parse(CPU2), 8, Constraints(), CostSettings(), api.tp_search_fn())
        v = 2 if schedule == "dualpipev" else 1
        return price_config(ctx, Config(2, 1, 1, 4, 2, schedule, v, 0), ctx.profile(1, 1))
    dual, one = priced("dualpipev"), priced("1f1b")
    total = lambda r: sum(s.memory["params"] for s in r.stages)     # noqa: E731
    assert total(dual) == pytest.approx(total(one), rel=1e-9)        # one copy of the tied weight either way
    assert one.comm_by_kind.get("pp_tied_grads", 0) > 0 and "pp_tied_grads" not in dual.comm_by_kind


def test_plan_validates_places_the_v_and_rescores_the_same():
    plan = _search({"pp": 2, "schedule": "dualpipev", "micro_batches": 4})
    pipe = plan["pipeline"]
    assert pipe["schedule"] == "dualpipev" and pipe["virtual_chunks"] == 2
    st = sorted(pipe["stages"], key=lambda s: s["index"])
    assert [s["device_stage"] for s in st] == [rank_of("dualpipev", 2, i) for i in range(4)] == [0, 1, 1, 0]
    assert [b for s in st for b in s["blocks"]] == [f"layers.{i}" for i in range(4)]
    again = Plan(json.loads(json.dumps(plan.to_dict())))     # validates (the JSON Schema too)
    assert again["pipeline"]["schedule"] == "dualpipev"
    res = api.evaluate(_gpt(), None, plan)
    assert res["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"], rel=1e-5)
    bad = json.loads(json.dumps(plan.to_dict()))
    bad["pipeline"]["stages"][3]["device_stage"] = 1
    with pytest.raises(PlanError, match="the V") as e:
        Plan(bad)
    assert "\n" not in str(e.value)


def test_unpinned_search_prices_dualpipev_where_it_fits():
    from sapp.capture import capture
    from sapp.costmodel import CostSettings
    from sapp.search.constraints import Constraints
    from sapp.search.joint import SearchContext
    from sapp.search.joint.configs import enumerate_configs
    g = capture(_gpt(4), batch=8)
    ctx = SearchContext(g, sapp.Cluster.parse(CPU2), 8, Constraints(), CostSettings(), api.tp_search_fn())
    scheds = {(c.pp, c.m, c.schedule, c.v) for c in enumerate_configs(ctx)}
    assert (2, 4, "dualpipev", 2) in scheds and (2, 8, "dualpipev", 2) in scheds
    # m < 2 pp: not offered (torch's ScheduleDualPipeV refuses it); 1f1b still is
    assert (2, 2, "1f1b", 1) in scheds and not any(s == (2, 2, "dualpipev", 2) for s in scheds)


@pytest.mark.parametrize("pins,layers,words", [
    ({"pp": 1, "schedule": "dualpipev"}, 4, "needs pp > 1"),
    ({"pp": 2, "schedule": "dualpipev", "micro_batches": 2}, 4, "micro_batches >= 2 x pp = 4"),
    ({"pp": 2, "schedule": "dualpipev"}, 3, "2 x pp = 4 chunks"),
    ({"pp": 2, "schedule": "dualpipev", "virtual_chunks": 3}, 4, "2 chunks per device"),
])
def test_refused_in_one_line(pins, layers, words):
    with pytest.raises(ConstraintError) as e:
        _search(pins, layers=layers)
    assert words in str(e.value) and "\n" not in str(e.value)


class _Two(torch.nn.Module):
    def __init__(self, deep):
        super().__init__()
        self.fc = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(2 if deep else 1)])

    def forward(self, h):
        return h + torch.tanh(self.fc(h))


class _Mixed(torch.nn.Module):
    """Blocks of two kinds (one and two linears): no V of identical chunks."""

    def __init__(self):
        super().__init__()
        self.inp, self.out = torch.nn.Linear(6, 16), torch.nn.Linear(16, 1)
        self.layers = torch.nn.ModuleList(_Two(i % 2 == 1) for i in range(4))

    def forward(self, x):
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def test_blocks_that_differ_under_a_stage_map_are_refused_in_one_line():
    # blocks that differ are priced over the blocks each device holds (tests/test_chunked_mixed_blocks.py);
    # a stage map cannot be dealt into the V
    x = torch.randn(8, 6)
    with pytest.raises(ConstraintError) as e:
        api.search(_Mixed(), sapp.Cluster.parse(CPU2), global_batch=8, example_inputs=(x,),
                   loss_fn=torch.nn.functional.mse_loss, targets=torch.randn(8, 1),
                   constraints={"pp": 2, "schedule": "dualpipev", "micro_batches": 4,
                                "stages": {"layers.0": 0, "layers.2": 1}})
    assert "stage map" in str(e.value) and "\n" not in str(e.value)


def test_cli_search_takes_the_schedule_and_evaluate_rescores_it(tmp_path, capsys):
    from sapp.commands.cli import main
    out = tmp_path / "p.json"
    assert main(["search", "--model", "gpt-tiny", "--model-arg", "l=4", "--cluster", CPU2, "--batch", "8", "--pp", "2",
                 "--schedule", "dualpipev", "--micro-batches", "4", "--out", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["pipeline"]["schedule"] == "dualpipev"
    # `sapp evaluate` re-scores it at the same step (the plan's model, with its recorded l=4)
    capsys.readouterr()
    assert main(["evaluate", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"], rel=1e-5)
    assert "schedule=dualpipev" in res["config"]


# ---- 2 gloo processes equal one process (float64) ------------------------------------------------------
GB, STEPS = 16, 3
MODEL = "tests.emit_workers.hetero_job:deep_factory"


def _run(tmp_path, plan, steps=STEPS):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict() if hasattr(plan, "to_dict") else plan))
    x, yy = hetero_job.batch(0, GB * STEPS)
    torch.save(((x,), yy), tmp_path / "data.pt")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return joblock.run([sys.executable, "-m", "sapp.commands.cli", "run", str(path), "--model", MODEL, "--steps",
                        str(steps), "--data", str(tmp_path / "data.pt"), "--out", str(tmp_path / "out.json")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _reference():
    x, yy = hetero_job.batch(0, GB * STEPS)
    ref_model = hetero_job.deep()
    opt = torch.optim.Adam(ref_model.parameters(), lr=1e-3)
    ref = []
    for k in range(STEPS):
        opt.zero_grad()
        lo = torch.nn.functional.mse_loss(ref_model(x[k * GB:(k + 1) * GB]), yy[k * GB:(k + 1) * GB])
        lo.backward()
        opt.step()
        ref.append(lo.item())
    return ref


def _deep_plan(spec, **pins):
    m, ex, y, loss = hetero_job.deep_factory()
    return api.search(m, sapp.Cluster.parse(spec), global_batch=GB, example_inputs=ex, loss_fn=loss, targets=y,
                      constraints={"pp": 2, "schedule": "dualpipev", "micro_batches": 4, **pins})


@pytest.mark.parametrize("spec,pins,procs", [
    # the searched plan keeps the optimizer on the host (optimizer-host): stepped after backward, since
    # torch's weight-gradient actions fire no accumulate hook (emit/steps/optimizers._offload_overlap)
    (CPU2, {}, 2),
    # 2 replicas of the V under FSDP2 (ZeRO-2)
    ("cpu:gpus=4", {"dp": 2, "zero": 2}, 4),
])
def test_sapp_run_trains_as_one_process_in_float64(tmp_path, spec, pins, procs):
    plan = _deep_plan(spec, **pins)
    st = sorted(plan["pipeline"]["stages"], key=lambda s: s["index"])
    assert len(st) == 4 and [s["device_stage"] for s in st] == [0, 1, 1, 0]
    if not pins:
        assert {g["optimizer"] for g in plan["placement"]["groups"].values()} == {"host"}
    p = _run(tmp_path, plan)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert f"launching {procs} process(es)" in p.stdout
    got, ref = json.loads((tmp_path / "out.json").read_text())["losses"], _reference()
    assert len(got) == STEPS and ref[-1] != ref[0]
    assert max(abs(a - b) / abs(b) for a, b in zip(got, ref)) <= 1e-10, (got, ref)


def test_optimizer_offload_priced_as_run_gradients_kept_until_the_step():
    # at dp 1 the offloaded gradients stream to the host during backward (1F1B: the device keeps none);
    # DualPipeV's weight-gradient actions fire no accumulate hook, so they cross after backward and the
    # device keeps them: only the optimizer states are saved
    for sched, grads_saved in (("dualpipev", False), ("1f1b", True)):
        plan = _deep_plan(CPU2, schedule=sched, placement={"optimizer": "host"})
        st = sorted(plan["pipeline"]["stages"], key=lambda s: s["index"])
        for saved, stage in zip(plan["placement"]["predicted"]["stages"], st):
            opt = stage["predicted"]["memory"]["optimizer"]
            if grads_saved:
                assert saved["saved_bytes"] > 1.2 * opt
            else:
                assert saved["saved_bytes"] == pytest.approx(opt, rel=1e-9)


def test_sapp_run_refuses_zero3_in_one_line(tmp_path):
    # FSDP2's reshard after forward beside torch's later weight-gradient pass trained 7.9e-3 off one
    # process at dp 2 x pp 2: the search never writes it, a hand-edited plan is refused before launch
    with pytest.raises(ConstraintError, match="not ZeRO-3"):
        _deep_plan("cpu:gpus=4", dp=2, zero=3)
    plan = json.loads(json.dumps(_deep_plan("cpu:gpus=4", dp=2, zero=2).to_dict()))
    plan["zero"] = 3
    p = _run(tmp_path, plan, steps=1)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert "dualpipev with ZeRO-3 is not emitted" in p.stderr and "launching" not in p.stdout
    assert len([ln for ln in p.stderr.splitlines() if "dualpipev" in ln]) == 1


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, h):
        return h + torch.tanh(self.fc(h))


class _Tied(torch.nn.Module):
    """GPT-2's tie in float64: the head reads the embedding's weight; under DualPipeV both sit on rank 0."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(32, 16)
        self.layers = torch.nn.ModuleList(_Block() for _ in range(4))
        self.head = torch.nn.Linear(16, 32, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        h = self.emb(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def _ce(out, target):
    return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def _tied_batch(n, step=0):
    ids = torch.randint(0, 32, (n, 9), generator=torch.Generator().manual_seed(1000 + step))
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def tied_factory():
    """`sapp run --model tests.test_dualpipev:tied_factory`: the tied model, an example batch, targets, loss."""
    torch.manual_seed(0)
    x, y = _tied_batch(8)
    return _Tied().double(), (x,), y, _ce


def test_tied_embedding_and_head_on_rank_0_train_as_one_process(tmp_path):
    m, ex, y, loss = tied_factory()
    plan = api.search(m, sapp.Cluster.parse(CPU2), global_batch=GB, example_inputs=ex, loss_fn=loss, targets=y,
                      constraints={"pp": 2, "schedule": "dualpipev", "micro_batches": 4, "placement": {"optimizer": "device"}})
    path = tmp_path / "plan.json"
    plan.save(path)
    x, yy = _tied_batch(GB * STEPS)
    torch.save(((x,), yy), tmp_path / "data.pt")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = joblock.run([sys.executable, "-m", "sapp.commands.cli", "run", str(path), "--model",
                     "tests.test_dualpipev:tied_factory", "--steps", str(STEPS), "--data", str(tmp_path / "data.pt"),
                     "--out", str(tmp_path / "out.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    got = json.loads((tmp_path / "out.json").read_text())["losses"]
    ref_model = tied_factory()[0]
    opt = torch.optim.Adam(ref_model.parameters(), lr=1e-3)
    ref = []
    for k in range(STEPS):
        opt.zero_grad()
        lo = _ce(ref_model(x[k * GB:(k + 1) * GB]), yy[k * GB:(k + 1) * GB])
        lo.backward()
        opt.step()
        ref.append(lo.item())
    assert ref[-1] != ref[0] and max(abs(a - b) / abs(b) for a, b in zip(got, ref)) <= 1e-10, (got, ref)


# ---- engines ---------------------------------------------------------------------------------------------
TOML = """[parallelism]
pipeline_parallel_degree = 2
data_parallel_shard_degree = -1
pipeline_parallel_schedule = "DualPipeV"
pipeline_parallel_microbatch_size = 1
[training]
local_batch_size = 8
global_batch_size = 32
seq_len = 2048
[activation_checkpoint]
mode = "full"
"""


@pytest.fixture(scope="module")
def gpt350m():
    cl = api.resolve_cluster("a100-80g:devices=8")
    graph, _ = api.capture_graph(api.resolve_model("gpt3-350m")[0])
    return graph, cl


def test_torchtitan_dualpipev_round_trip(gpt350m):
    import sapp.engines as E
    graph, cl = gpt350m
    plan = E.import_config(TOML, "torchtitan@0.2.2", graph, cl, "gpt3-350m")
    pipe = plan["pipeline"]
    assert pipe["schedule"] == "dualpipev" and pipe["micro_batches"] == 8 and pipe["virtual_chunks"] == 2
    st = sorted(pipe["stages"], key=lambda s: s["index"])
    # torchtitan's own split of 24 layers + embedding + output over 4 stages, placed in the V: each rank
    # holds as many layers as torchtitan gives its two stages (rank 0: stages 0 and 3)
    from sapp.engines.torchtitan import stage_layers
    tt = stage_layers(24, 4, 1, 1)
    n = [len(s["blocks"]) for s in st]
    assert [n[0] + n[3], n[1] + n[2]] == [tt[0] + tt[3], tt[1] + tt[2]]
    assert [s["device_stage"] for s in st] == [0, 1, 1, 0]
    text, _, notes = E.export_plan(plan, "torchtitan@0.2.2", graph=graph, cluster=cl)
    assert not notes and 'pipeline_parallel_schedule = "DualPipeV"' in text
    again = E.import_config(text, "torchtitan@0.2.2", graph, cl, "gpt3-350m")
    assert again["pipeline"]["schedule"] == "dualpipev"
    assert again["predicted"]["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"], rel=1e-6)
    # torchtitan 0.3's Python job names it the same way, and reads back at the same price
    text3, exported3, _ = E.export_plan(plan, "torchtitan", graph=graph, cluster=cl)
    assert "pipeline_parallel_schedule='DualPipeV'" in text3
    back3 = E.import_config(text3, "torchtitan", graph, cl, "gpt3-350m")
    assert back3["pipeline"]["schedule"] == "dualpipev"
    assert back3["predicted"]["step_time_s"] == pytest.approx(exported3["predicted"]["step_time_s"], rel=1e-6)
    # 3 stages a rank is no V
    with pytest.raises(E.EngineError, match="DualPipeV runs 2"):
        E.import_config(TOML.replace("pipeline_parallel_microbatch_size = 1",
                                     "pipeline_parallel_microbatch_size = 1\npipeline_parallel_layers_per_stage = 5"),
                        "torchtitan@0.2.2", graph, cl, "gpt3-350m")


def test_megatron_and_deepspeed_refuse_dualpipev_in_one_line(gpt350m):
    import sapp.engines as E
    graph, cl = gpt350m
    plan = E.import_config(TOML, "torchtitan@0.2.2", graph, cl, "gpt3-350m")
    for engine, words in (("megatron", "Megatron-LM has no DualPipeV schedule"),
                          ("deepspeed", "states data parallelism only")):
        with pytest.raises(E.EngineError) as e:
            E.export_plan(plan, engine, graph=graph, cluster=cl)
        assert words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConstraintError, match="target megatron has no 'dualpipev' schedule"):
        api.search("gpt3-350m", cl, graph=graph, global_batch=32, constraints={"target": "megatron", "schedule": "dualpipev"})
