"""MoE zoo models, the expert-parallel cost model (sapp/costmodel/moe.py) against hand-computed
numbers, and ep in the joint search and the plan."""
import json
import math

import pytest
import torch

import sapp.models as zoo
from sapp.capture import capture
from sapp.cluster import Cluster
from sapp.costmodel import CostSettings
from sapp.costmodel import moe as cm
from sapp.errors import PlanError, SappError
from sapp.plan import Plan


def _tiny_expert_params():
    c = zoo.info("moe-tiny")["config"]
    return (c["l"] - c["dense"]) * c["experts"] * 3 * c["h"] * c["expert_ffn"]


# ---- zoo ------------------------------------------------------------------------------------------
def test_param_counts_match_the_modules_and_the_published_sizes():
    torch.manual_seed(0)
    for name in ("moe-tiny", "mixtral-8x7b", "deepseek-v3-like"):
        m = zoo.get(name)
        assert sum(p.numel() for p in m.parameters()) == zoo.info(name)["params"], name
    active = lambda n: zoo.BUILDERS["moe"][1](**zoo.info(n)["config"], active=True)  # noqa: E731
    # Mixtral-8x7B: 46.7B total, 12.9B active (Mistral's announcement); DeepSeek-V3: 671B / 37B
    assert zoo.info("mixtral-8x7b")["params"] == pytest.approx(46.7e9, rel=0.01)
    assert active("mixtral-8x7b") == pytest.approx(12.9e9, rel=0.01)
    assert zoo.info("deepseek-v3-like")["params"] == pytest.approx(671e9, rel=0.03)
    assert active("deepseek-v3-like") == pytest.approx(37e9, rel=0.03)


def test_tiny_moe_captures_its_expert_gemms_with_no_unknown_op():
    m = zoo.get("moe-tiny")
    c = zoo.info("moe-tiny")["config"]
    B = 4
    g = capture(m, batch=B)
    assert g.meta["unknown_ops"] == []
    gemms = [n for n in g.nodes.values() if n.extra.get("experts")]
    assert len(gemms) == 2 * c["l"]
    R = B * c["s"] * c["top_k"]
    # hand count: [R, h] x [h, 2f] and [R, f] x [f, h] per layer
    assert sum(n.flops for n in gemms) == c["l"] * (2 * R * c["h"] * 2 * c["expert_ffn"] + 2 * R * c["expert_ffn"] * c["h"])
    assert any("scaled_dot_product" in n.target for n in g.nodes.values())


def test_capacity_factor_drops_rows_past_capacity_only():
    torch.manual_seed(0)
    dropless = zoo.get("moe-tiny", device="cpu")
    x = zoo.example_inputs(dropless, 2)
    y0 = dropless(*x)
    c = zoo.info("moe-tiny")["config"]
    for cf, same in ((float(c["experts"]), True), (0.25, False)):   # cf = E: capacity holds every row
        torch.manual_seed(0)
        m = zoo.get("moe-tiny", device="cpu", capacity_factor=cf)
        assert torch.allclose(m(*x), y0) == same, cf


# ---- cost model -----------------------------------------------------------------------------------
def test_routed_rows_and_load():
    r = cm.routed_rows(tokens=4096, top_k=2, experts=8, ep=8, imbalance=1.2)
    assert r["per_expert"] == pytest.approx(8 * 4096 * 2 / 8 * 1.2)
    assert r["per_rank"] == pytest.approx(4096 * 2 * 1.2)            # E/ep = 1 expert per rank
    # a capacity factor pads every expert to capacity whatever the imbalance
    assert cm.routed_rows(4096, 2, 8, 4, capacity_factor=1.25, imbalance=3.0)["per_rank"] == pytest.approx(4096 * 2 * 1.25)


def test_all_to_all_inside_a_node_and_across_nodes():
    cl = Cluster.parse("h800:nodes=4")
    B = 64e6
    a_i, b_i = cl.intra_latency, cl.intra_bw
    a_n, b_n = cl.inter_latency, cl.inter_bw
    # 8 ranks in one node: REFERENCE (n-1)α + (n-1)/n·B/β on NVLink
    assert cm.all_to_all_time(B, 8, 8, cl) == pytest.approx(7 * a_i + 7 / 8 * B / b_i)
    # 32 ranks over 4 nodes: 7 peers on NVLink, 24 over IB at once; the network part is slower
    intra = 7 * a_i + B * 7 / 32 / b_i
    inter = 24 * a_n + B * 24 / 32 / b_n
    assert cm.all_to_all_time(B, 32, 8, cl) == pytest.approx(max(intra, inter))
    assert cm.ep_local(32, 1, 8) == 8 and cm.ep_local(4, 2, 8) == 4 and cm.ep_local(8, 8, 8) == 1
    f, b = cm.dispatch_combine_time(1000, 2, 4096, 2, 8, 8, cl)
    assert f == b == pytest.approx(2 * cm.all_to_all_time(1000 * 2 * 4096 * 2, 8, 8, cl))


def test_expert_states_and_sync_over_expert_dp():
    s = CostSettings(precision="bf16-mixed")
    st = cm.expert_state_bytes(1e9, dp=16, ep=8, zero=1, settings=s)
    # 1/8 of the experts per rank, optimizer states ZeRO-1 over the 2 expert-DP ranks
    assert st["params"] == pytest.approx(2 * 1e9 / 8)
    assert st["grads"] == pytest.approx(2 * 1e9 / 8)
    assert st["optimizer"] == pytest.approx(12 * 1e9 / 8 / 2)
    cl = Cluster.parse("h100-80g:nodes=2")
    # all-reduce bandwidth term 2(n-1)/n·B/β over 2 ranks of 1/8 of the bf16 gradients
    assert cm.expert_sync_time(1e9, 16, 8, "inter", cl, s) == pytest.approx(2 * 1 / 2 * (2e9 / 8) / cl.inter_bw)
    assert cm.expert_sync_time(1e9, 8, 8, "inter", cl, s) == 0.0     # ep = dp: nothing to sync


def test_layer_time_parts():
    cl = Cluster.parse("h100-80g:nodes=1")
    t = cm.moe_layer_time(4096, 4096, 8, 2, 14336, ep=8, local=8, cluster=cl)
    ef = 2.0 * 4096 * 2 * 4096 * 2 * 14336 + 2.0 * 4096 * 2 * 14336 * 4096
    assert t["fwd"]["experts"] == pytest.approx(ef / (cl.peak_flops * cl.compute_efficiency) * cl.compute_scale)
    assert t["bwd"]["experts"] == pytest.approx(2 * t["fwd"]["experts"])
    assert t["fwd"]["all_to_all"] > 0 and t["fwd_s"] == pytest.approx(sum(t["fwd"].values()))


def test_imbalance_setting_is_validated():
    with pytest.raises(SappError, match="moe_imbalance"):
        CostSettings(moe_imbalance=0.5)


# ---- search and plan ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_graph():
    return capture(zoo.get("moe-tiny"), batch=8)


def test_ep_is_searched_and_priced(tiny_graph):
    from sapp.search.joint import joint_search
    cl = Cluster.parse("cpu:gpus=4")
    s = CostSettings(precision="fp32")
    pins = dict(dp=4, tp=1, pp=1, micro_batches=1, zero=0, recompute="none")
    r1 = joint_search(tiny_graph, cl, global_batch=8, constraints=dict(pins, ep=1), settings=s)
    r2 = joint_search(tiny_graph, cl, global_batch=8, constraints=dict(pins, ep=2), settings=s)
    assert r1.config.ep == 1 and r2.config.ep == 2
    # each rank holds half the experts: weights, gradients, Adam states drop by 1/2 of the experts'
    P = _tiny_expert_params()
    m1, m2 = r1.stages[0].memory, r2.stages[0].memory
    assert m1["params"] - m2["params"] == pytest.approx(4 * P / 2)
    assert m1["grads"] - m2["grads"] == pytest.approx(4 * P / 2)
    assert m1["optimizer"] - m2["optimizer"] == pytest.approx(8 * P / 2)
    # the all-to-alls are priced: forward grows by at least one layer's dispatch + combine per block
    c = zoo.info("moe-tiny")["config"]
    a2a = cm.dispatch_combine_time(2 * c["s"], c["top_k"], c["h"], 4.0, 2, 2, cl)[0]
    assert r2.stages[0].fwd_s >= r1.stages[0].fwd_s + c["l"] * a2a * (1 - 1e-9)
    # ep is not offered where it is not emitted (tp > 1) nor for a dense model
    with pytest.raises(SappError):
        joint_search(tiny_graph, cl, global_batch=8, constraints=dict(pins, dp=2, tp=2, ep=2), settings=s)


def test_plan_carries_ep_round_trips_and_old_plans_load(tiny_graph, tmp_path):
    from sapp.api import evaluate, search
    m = zoo.get("moe-tiny")
    cons = dict(dp=4, tp=1, pp=1, ep=2, zero=0)
    p = search(m, "cpu:gpus=4", global_batch=8, graph=tiny_graph, constraints=cons)
    assert p["parallel"]["ep"] == 2
    p.save(tmp_path / "a.json")
    again = search(m, "cpu:gpus=4", global_batch=8, graph=tiny_graph, constraints=cons)
    again.save(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    res = evaluate(m, None, Plan.load(tmp_path / "a.json"))
    assert res["step_time_s"] == pytest.approx(p["predicted"]["step_time_s"], rel=1e-5)
    from sapp.report.explain import explain
    assert "ep=2" in explain(p)
    d = json.loads((tmp_path / "a.json").read_text())
    del d["parallel"]["ep"]                     # a plan written before ep existed: ep 1
    Plan(d)
    d["parallel"]["ep"] = 3
    with pytest.raises(PlanError, match="ep=3 must divide dp=4"):
        Plan(d)
    d["parallel"]["ep"] = 0
    with pytest.raises(PlanError):
        Plan(d)


def test_ep_offered_only_for_moe_layers_the_emitter_runs(tiny_graph):
    """Capture lists the MoE layers of sapp's contract; the search gives ep > 1 to those only (an HF
    MoE's grouped experts are run whole on each rank, so ep there would be refused at run time)."""
    import dataclasses
    from sapp.search.joint import joint_search
    from sapp.models.moe import MoE
    mods = sorted(n for n, m in zoo.get("moe-tiny").named_modules() if isinstance(m, MoE))
    assert mods and tiny_graph.meta["ep_modules"] == mods
    cl = Cluster.parse("cpu:gpus=4")
    s = CostSettings(precision="fp32")
    pins = dict(dp=4, tp=1, pp=1, micro_batches=1, zero=0, recompute="none", ep=2)
    assert joint_search(tiny_graph, cl, global_batch=8, constraints=pins, settings=s).config.ep == 2
    foreign = dataclasses.replace(tiny_graph, meta={**tiny_graph.meta, "ep_modules": []})
    with pytest.raises(SappError):
        joint_search(foreign, cl, global_batch=8, constraints=pins, settings=s)
    free = dict(pins)
    free.pop("ep")
    assert joint_search(foreign, cl, global_batch=8, constraints=free, settings=s).config.ep == 1
