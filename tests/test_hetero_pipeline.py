"""Pipeline stages on the groups of a mixed cluster (sapp/search/hetero_pipeline.py, mode "pipeline"):
a two-group CPU cluster whose first group is declared 3x slower gets uneven stages (the slow group's
stage fewer layers), priced per group; `sapp run` of the plan trains on two gloo ranks equal to one
process in float64; what the emitter cannot run across groups is refused in one line before launch."""
import json
import os
import sys

import pytest
import torch

from sapp.errors import PlanError
from tests.emit_workers import hetero_job, joblock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "tests.emit_workers.hetero_job:deep_factory"
GB, STEPS = 16, 3
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
# compute-bound figures (no launch overhead, memory 1e4x faster): a stage's time is its FLOPs / speed
SPEC = "cpu:gpus=1,peak_flops={},op_overhead=0,update_op_overhead=0,inter_latency=0,mem_bandwidth={},rng_rate=1e12"


def _cluster():
    from sapp.cluster.groups import parse
    return parse(SPEC.format("0.1GFLOP/s", "1TB/s") + "+" + SPEC.format("0.3GFLOP/s", "3TB/s"))


@pytest.fixture(scope="module")
def plan_doc():
    from sapp.api import mixed as hetero_plan
    doc, timing = hetero_plan.search(MODEL, _cluster(), global_batch=GB, mode="pipeline")
    return doc, timing


def test_slower_group_gets_fewer_layers_and_stage_times_follow_speed(plan_doc):
    from sapp import api
    from sapp.search.constraints import Constraints
    from sapp.costmodel import CostSettings
    from sapp.search import hetero_pipeline
    from sapp.search.joint.stage import StageEvaluator
    doc, timing = plan_doc
    assert doc["groups"]["mode"] == "pipeline" and doc["parallel"]["pp"] == 2 and doc["parallel"]["dp"] == 1
    by = {g["name"]: g["stages"] for g in doc["groups"]["members"]}
    slow, fast = by["cpu"], by["cpu-2"]          # group cpu is the 3x slower one
    assert len(slow) == len(fast) == 1
    assert 1 <= len(slow[0]["blocks"]) < len(fast[0]["blocks"]) and len(slow[0]["blocks"]) + len(fast[0]["blocks"]) == 8
    # the inner pp plan every rank runs has the same uneven stages, in the groups' listed order
    assert [s["blocks"] for s in doc["pipeline"]["stages"]] == [g["stages"][0]["blocks"] for g in doc["groups"]["members"]]
    # the auto mode prices both and keeps the faster (here the data mode: no bubble)
    assert timing["data_step_s"] < timing["pipeline_step_s"]      # the plan rounds to 6 digits as every plan does
    assert doc["predicted"]["step_time_s"] == pytest.approx(timing["pipeline_step_s"], rel=5e-6)
    # a stage's price follows its group's speed: the same units cost 3x on the slow group
    mc = _cluster()
    graph, _ = api.capture_graph(*hetero_job.deep_factory()[:2])
    cons, settings = Constraints.from_dict(None), CostSettings()
    pipe, why, _ = hetero_pipeline.search(graph, mc, global_batch=GB, constraints=cons, settings=settings,
                                          search_fn=api.tp_search_fn())
    assert why is None and [mc.groups[g].name for g in dict.fromkeys(pipe.order)] == [g["name"] for g in doc["groups"]["members"]]
    ctxs = hetero_pipeline.contexts(graph, mc, GB, cons, settings, api.tp_search_fn())
    evs = {g: StageEvaluator(ctxs[g], pipe.config, ctxs[g].profile(1, 1)) for g in (0, 1)}
    n = evs[0].n
    for i, a, b in ((0, 0, 3), (0, 0, 5), (1, 4, n), (1, 7, n)):
        (ts, ok0), (tf, ok1) = evs[0].seg(i, a, b), evs[1].seg(i, a, b)
        assert ok0 and ok1 and ts == pytest.approx(3 * tf, rel=1e-3)
    # the price is the search's, and the partition balances the stage totals: one more layer on the slow
    # group's stage makes it the slowest stage
    again = hetero_pipeline.price(mc, evs, pipe.order, pipe.config, ctxs)
    assert again.result.step_time_s == pipe.result.step_time_s
    st = pipe.result.stages
    T = [s.fwd_s + s.bwd_s + s.send_s for s in st]
    i = pipe.order.index(0)                        # the slow group's stage
    a, b = (0, len(st[0].units) + 1) if i == 0 else (n - len(st[1].units) - 1, n)
    assert evs[0].seg(i, a, b)[0] > max(T) and n == 10


def test_explain_shows_each_groups_stages(plan_doc, tmp_path, capsys):
    from sapp.api import mixed as hetero_plan
    from sapp.commands.cli import main
    doc, _ = plan_doc
    path = tmp_path / "mixed.json"
    path.write_text(hetero_plan.dumps(doc))
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "(pipeline stages on the groups, uneven stages)" in out
    assert f"pipeline: 2 stages x 1 devices (dp=1 tp=1), {doc['pipeline']['micro_batches']} micro-batches" in out
    for g in doc["groups"]["members"]:
        st = g["stages"][0]
        n = len(st["blocks"])
        assert f"group {g['name']}: 1 devices, stage {st['index']}, layers {n}" in out
        assert f"stage {st['index']}: {n} layers ({st['blocks'][0]}..{st['blocks'][-1]}" in out
    assert "data mode (uneven batch shares): " in out


def _reference(x, y):
    m = hetero_job.deep()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    losses = []
    for k in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x[k * GB:(k + 1) * GB]), y[k * GB:(k + 1) * GB])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _cli(tmp_path, doc, *extra, timeout=120):
    plan = tmp_path / "mixed.json"
    plan.write_text(json.dumps(doc))
    return joblock.run([sys.executable, "-m", "sapp.commands.cli", "run", str(plan), "--model", MODEL, "--steps", str(STEPS),
                        *extra], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def test_uneven_stages_run_as_one_process(plan_doc, tmp_path):
    doc, _ = plan_doc
    x, y = hetero_job.batch(0, GB * STEPS)
    torch.save(((x,), y), tmp_path / "data.pt")
    p = _cli(tmp_path, doc, "--data", str(tmp_path / "data.pt"), "--out", str(tmp_path / "out.json"), timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "launching 2 process(es)" in p.stdout
    losses = json.loads((tmp_path / "out.json").read_text())["losses"]
    ref = _reference(x, y)
    assert len(losses) == STEPS and max(abs(a - b) for a, b in zip(losses, ref)) <= 1e-9, (losses, ref)


@pytest.mark.parametrize("case", ["tp-stage", "interleaved", "stages-out-of-order"])
def test_refused_in_one_line_before_launch(plan_doc, tmp_path, case):
    doc = json.loads(json.dumps(plan_doc[0]))
    if case == "tp-stage":
        doc["parallel"]["tp"] = 2
        words = "dp x tp x pp = 1x2x2 does not equal devices=2"
    elif case == "interleaved":
        doc["pipeline"].update(schedule="interleaved", virtual_chunks=2)
        words = "stages across groups are emitted for 1f1b or gpipe without interleaving"
    else:
        doc["groups"]["members"].reverse()
        words = "the groups' stages are [1, 0], not 0..1 in group order"
    p = _cli(tmp_path, doc)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert words in p.stderr and "launching" not in p.stdout
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_ranks_out_of_stage_order_are_refused(plan_doc):
    from sapp.emit.runtime import hetero_run
    doc, _ = plan_doc
    first, second = (g["name"] for g in doc["groups"]["members"])
    with pytest.raises(PlanError, match=f"rank 0 is in group {second}, not {first}: start the groups' nodes in that"):
        hetero_run._place_stages(doc, [second, first], 0)
    assert hetero_run._place_stages(doc, [first, second], 1) is None
    assert hetero_run.rank_plan(doc, "cpu-2", 2).parallel == {"dp": 1, "tp": 1, "pp": 2}


def test_mixed_mode_on_one_kind_is_refused(capsys):
    from sapp.commands.cli import main
    assert main(["search", "--model", "mlp-tiny", "--cluster", "cpu", "--mixed-mode", "pipeline"]) == 2
    err = capsys.readouterr().err
    assert "--mixed-mode pipeline is for mixed clusters (A+B); cpu is one device kind" in err
    assert len(err.strip().splitlines()) == 1


def test_auto_mode_keeps_the_faster(plan_doc):
    """At the groups' default link the data mode is the faster (no bubble); over a link 100x slower the
    cross-group gradient all-reduce costs more than the pipeline's activation sends."""
    from sapp.api import mixed as hetero_plan
    from sapp.cluster.groups import MixedCluster
    _, timing = plan_doc
    mc = _cluster()
    auto, t = hetero_plan.search(MODEL, mc, global_batch=GB)
    assert auto["groups"]["mode"] == "data" and auto["predicted"]["step_time_s"] == pytest.approx(timing["data_step_s"], rel=5e-6)
    # the pipeline mode's step beside it, or (no configuration's lower bound beat it) pruned above it
    if t["pipeline_step_s"] is None:
        assert t["pipeline_step_above_s"] == timing["data_step_s"] and t["pipeline_why"].startswith("no pipeline beats")
    else:
        assert timing["data_step_s"] < t["pipeline_step_s"] == timing["pipeline_step_s"]
    slow = MixedCluster.build(mc.groups, link_bw=mc.link_bw / 200, link_latency=mc.link_latency)
    doc, t = hetero_plan.search(MODEL, slow, global_batch=GB)
    assert doc["groups"]["mode"] == "pipeline" and t["pipeline_step_s"] < t["data_step_s"]
    assert doc["predicted"]["step_time_s"] == pytest.approx(t["pipeline_step_s"], rel=5e-6)
    assert doc["groups"]["baselines"]["data_mode"] == pytest.approx(t["data_step_s"], rel=5e-6)


def test_pruned_search_equals_the_exhaustive_one(monkeypatch):
    """Branch and bound over the configurations (hetero_pipeline.step_floor) returns the exhaustive
    search's pipeline, to the bit, ties included; every floor is at most its configuration's price;
    a cutoff above the best changes nothing and one far below it prunes every configuration."""
    import itertools
    from sapp import api
    from sapp.cluster.groups import MixedCluster, parse
    from sapp.search.constraints import Constraints
    from sapp.costmodel import CostSettings
    from sapp.search import hetero_pipeline as hp
    from sapp.search.joint.stage import StageEvaluator
    graph, _ = api.capture_graph(*hetero_job.deep_factory()[:2])
    cons, settings = Constraints.from_dict(None), CostSettings()
    base = _cluster()
    three = parse("+".join(SPEC.format(f, m) for f, m in (("0.1GFLOP/s", "1TB/s"), ("0.3GFLOP/s", "3TB/s"),
                                                            ("0.2GFLOP/s", "2TB/s"))))
    for mc in (base, MixedCluster.build(base.groups, link_bw=base.link_bw / 200, link_latency=base.link_latency),
               three):
        for gb in (GB, 48):
            def run(**kw):
                return hp.search(graph, mc, global_batch=gb, constraints=cons, settings=settings,
                                 search_fn=api.tp_search_fn(), **kw)
            got, why, n = run()
            with monkeypatch.context() as mp:
                mp.setattr(hp, "step_floor", lambda *a: 0.0)       # no floor prunes: every configuration priced
                full, why_full, n_full = run()
            assert why is None and why_full is None and n <= n_full
            assert (got.result.step_time_s, got.config, got.order, got.link_s) == (
                full.result.step_time_s, full.config, full.order, full.link_s)
            assert [s.units for s in got.result.stages] == [s.units for s in full.result.stages]
            step = full.result.step_time_s
            assert run(cutoff=step * 1.01)[0].result.step_time_s == step
            at, why_at, _ = run(cutoff=step)        # nothing beats it: pruned, or the best itself when priced
            assert (at is None and why_at.startswith(hp.PRUNED)) or at.result.step_time_s == step
            none, why_c, _ = run(cutoff=step * 1e-6)
            assert none is None and why_c == f"{hp.PRUNED} {step * 1e-6:.4g} s"
            # every floor is a lower bound of its configuration's price, whatever the order of the groups
            ctxs = hp.contexts(graph, mc, gb, cons, settings, api.tp_search_fn())
            G = len(mc.groups)
            for w in hp.widths(mc, cons, ctxs[0].L):
                P = sum(c.devices // w for c in mc.groups)
                for cfg in hp.configs(ctxs[0], cons, w, P):
                    evs = {g: StageEvaluator(ctxs[g], cfg, ctxs[g].profile(w, 1)) for g in range(G)}
                    floor = hp.step_floor(evs, cfg, ctxs, mc, w)
                    for perm in itertools.permutations(range(G)):
                        r = hp.price(mc, evs, tuple(g for g in perm for _ in range(mc.groups[g].devices // w)), cfg, ctxs)
                        assert r is None or floor <= r.result.step_time_s

