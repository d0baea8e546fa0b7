"""Megatron's scatter/gather at pipeline stage boundaries with tensor parallelism and no sequence
parallelism (sapp.search.joint.numbers.boundary_send, sapp/emit/pp/pipe.scatter_gather).

Pricing, by hand: a plain send is alpha + B/beta over the inter-stage link from every tp rank; the
scatter/gather sends B/t and all-gathers over the tp group's link, (t-1)(alpha + B/(t beta)).  It is
taken exactly when cheaper.  Emitted: gpt-tiny tp2 x pp2 (4 gloo ranks, bounded) equals single-process
training within 1e-5 over 3 steps, stage 0 sends B/2 (torch.distributed.pipelining's own output
metadata, checked against B from the model's shapes and against the plan's boundary_bytes), the
manifest shows the split / gather on the stages the plan puts them, and measured memory per rank is
within 10% of the plan's prediction for its stage."""
import json
import os
import sys
import tempfile
from types import SimpleNamespace

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from sapp.cluster import Cluster  # noqa: E402
from sapp.errors import PlanError  # noqa: E402
from sapp.search.joint.numbers import boundary_send, p2p_time  # noqa: E402
from tests.emit_workers import joblock  # noqa: E402

B = float(2 ** 23)          # an 8 MiB boundary activation per device and micro-batch


def _ctx(nodes, gpn):
    return SimpleNamespace(cluster=Cluster("t", nodes=nodes, gpus_per_node=gpn, intra_bw=300e9, intra_latency=5e-6,
                                           inter_bw=25e9, inter_latency=10e-6))


def _cfg(pp, tp):
    return SimpleNamespace(pp=pp, tp=tp)


def test_across_nodes_each_tp_rank_sends_an_eighth_and_the_next_stage_gathers():
    ctx = _ctx(nodes=2, gpn=8)            # pp=2 x tp=8: each stage fills one node, boundaries cross the network
    s, sg, sent = boundary_send(ctx, _cfg(2, 8), B)
    plain = 10e-6 + B / 25e9                                                  # 345.5 us
    scatter = 10e-6 + B / 8 / 25e9 + 7 * 5e-6 + 7 / 8 * B / 300e9             # 111.4 us
    assert sg is True and sent == B / 8
    assert s == pytest.approx(scatter, rel=1e-12) and s < plain / 3


def test_inside_one_node_the_plain_send_is_kept():
    ctx = _ctx(nodes=1, gpn=8)            # pp=2 x tp=4 in one node: both ways cross NVLink, the gather adds latency
    s, sg, sent = boundary_send(ctx, _cfg(2, 4), B)
    assert sg is False and sent == B
    assert s == pytest.approx(5e-6 + B / 300e9, rel=1e-12)
    # the scatter/gather would cost 3 more hops of latency for the same bytes
    assert 5e-6 + B / 4 / 300e9 + 3 * 5e-6 + 3 / 4 * B / 300e9 > s


def test_sequence_parallel_boundary_is_already_a_shard():
    ctx = _ctx(nodes=2, gpn=8)
    s, sg, sent = boundary_send(ctx, _cfg(2, 8), B / 8, replicated=False)
    assert sg is False and sent == B / 8 and s == pytest.approx(10e-6 + B / 8 / 25e9, rel=1e-12)


def test_bound_send_never_above_the_priced_one():
    ctx = _ctx(nodes=2, gpn=8)
    for tp, rep in ((8, True), (8, False), (1, True), (4, True)):
        assert p2p_time(ctx, _cfg(2, tp), B) <= boundary_send(ctx, _cfg(2, tp), B, rep)[0] + 1e-15


def test_plan_refuses_scatter_gather_without_a_tp_group():
    from sapp.plan import Plan
    from tests.emit_workers.sp_plans import forced_plan
    plan = forced_plan("gpt-tiny", world=2, constraints={"dp": 1, "tp": 1, "pp": 2, "zero": 0, "recompute": "none"},
                       model_args={"dropout": 0.0})
    assert "scatter_gather" not in plan.pipeline            # tp = 1: the old form
    d = json.loads(json.dumps(plan._d))
    d["pipeline"]["scatter_gather"] = True
    with pytest.raises(PlanError, match="scatter_gather"):
        Plan(d)


# ---- the emitted program (4 gloo ranks) --------------------------------------------------------------
GB = 8
TWO_NODES = "cpu:gpus=2,nodes=2,inter_bw=1e8"   # a network 20x slower than the tp group's link


def _plan(cluster):
    from tests.emit_workers.sp_plans import forced_plan
    # (1F1B: two stages, one boundary; the 2-layer model's interleaved Llama 3 layout has three)
    cons = {"dp": 1, "tp": 2, "pp": 2, "zero": 0, "recompute": "none", "sp": False, "schedule": "1f1b",
            "placement": {"optimizer": "device"}}
    return forced_plan("gpt-tiny", world=4, constraints=cons, global_batch=GB, model_args={"dropout": 0.0},
                       cluster=cluster)


@pytest.fixture(scope="module")
def job():
    plan = _plan(TWO_NODES)
    with tempfile.TemporaryDirectory() as tmp:
        path, out = os.path.join(tmp, "plan.json"), os.path.join(tmp, "out.json")
        plan.save(path)
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = joblock.run([sys.executable, "-m", "tests.emit_workers.sg_job", "4", path, out, str(GB)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
        assert os.path.exists(out), proc.stderr[-2000:]
        with open(out) as f:
            res = json.load(f)
    return plan, res


def test_one_node_plan_keeps_the_plain_send():
    plan = _plan("cpu:gpus=4")          # stages on one machine: same link both ways
    assert plan.pipeline["scatter_gather"] is False


def test_scatter_gather_equals_single_process_training(job):
    plan, res = job
    assert plan.pipeline["scatter_gather"] is True and plan.parallel.get("sp") is False
    assert any("scatter/gather" in n for n in plan["notes"])
    assert res["failed"] is None
    assert len(res["ranks"]) == 4
    for r, v in res["ranks"].items():
        assert "error" not in v, v.get("error")
        for a, b in zip(v["losses"], res["single"]):
            assert a == pytest.approx(b, rel=1e-5)
        assert v["manifest"]["scatter_gather"] == v["expected"]["scatter_gather"]
        want = ["split-output"] if v["stage"] == 0 else ["gather-input"]
        assert v["manifest"]["scatter_gather"] == {str(v["stage"]): want}


def test_stage_sends_its_tp_share_of_the_boundary(job):
    plan, res = job
    import sapp.models as models
    m = models.get("gpt-tiny", device="meta", dropout=0.0)
    x = models.example_inputs(m, 1, "meta")[0]
    seq, hidden = x.shape[-1], m.ln_f.normalized_shape[0]
    mbs = plan.pipeline["micro_batch_size"]
    whole = mbs * seq * hidden * 4                              # fp32 residual stream of one micro-batch
    assert plan.pipeline["boundary_bytes"] == whole / 2
    for r, v in res["ranks"].items():
        if v["stage"] == 0:
            assert v["sent"]["0"]["bytes"] == whole / 2 == plan.pipeline["boundary_bytes"]
            assert v["sent"]["0"]["shapes"] == [[mbs, seq, hidden // 2]]


def _total(mem):
    return sum(v for k, v in mem.items() if k not in ("total", "buffers"))


def test_scatter_gather_memory_within_ten_percent(job):
    plan, res = job
    stages = {s["index"]: s["predicted"]["memory"] for s in plan.pipeline["stages"]}
    for r, v in res["ranks"].items():
        pred, meas = stages[v["stage"]], v["measured"]
        assert _total(meas) == pytest.approx(_total(pred), rel=0.10), (r, meas, pred)
        assert meas["activations"] == pytest.approx(pred["activations"], rel=0.10), (r, meas, pred)
