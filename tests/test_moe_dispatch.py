"""DeepSeek-V3's MoE mechanisms priced from the published facts (costmodel/moe.py, models/mla.py):
node-limited hierarchical dispatch, FP8 dispatch, the experts' weights an EP rank reads, MLA and
group-limited routing in the zoo's `deepseek-v3`.  Each number against a hand count."""
import pytest
import torch

import sapp.models as zoo
from sapp.capture import capture
from sapp.cluster import Cluster
from sapp.costmodel import CostSettings, compute_time
from sapp.costmodel import moe as cm
from sapp.models.moe import MoEModel


def _net(**kw):
    # latency-free links: the byte counts alone set the times
    return Cluster.parse("h800:nodes=8").replace(intra_latency=0.0, inter_latency=0.0, **kw)


def test_node_limited_routing_bounds_the_network_bytes_by_the_nodes_a_token_reaches():
    cl = _net()
    T, k, row = 4096, 8, 7168 * 2
    # EP 64 over 8 nodes, a token on at most 4 of them: 4 x 7/8 network copies of each token, not the
    # 8 x 56/64 of a plain all-to-all; its k rows forwarded over NVLink, 7/8 of them to another GPU
    inter = T * 4 * 7 / 8 * row / cl.inter_bw
    intra = T * k * 7 / 8 * row / cl.intra_bw
    assert cm.node_limited_time(T, k, row, 64, 8, 4, cl) == pytest.approx(max(inter, intra))
    plain = cm.all_to_all_time(T * k * row, 64, 8, cl)
    assert plain == pytest.approx(T * k * 56 / 64 * row / cl.inter_bw)
    assert cm.node_limited_time(T, k, row, 64, 8, 4, cl) == pytest.approx(plain * 3.5 / 7)
    # the groups the router keeps are the nodes a token reaches (groups = nodes at EP 64; at EP 128 over
    # 16 nodes a group spans 2 nodes), never more than the group has
    assert cm.nodes_reached(256, 64, 8, 8, 4) == 4
    assert cm.nodes_reached(256, 128, 8, 8, 4) == 8
    assert cm.nodes_reached(256, 64, 8, 0, 0) == 8 and cm.nodes_reached(256, 8, 8, 8, 4) == 1


def test_fp8_dispatch_halves_the_dispatch_bytes_and_leaves_the_combine_bf16():
    cl = _net()
    T, k, h = 4096, 8, 7168
    bf16 = cm.dispatch_combine_time(T, k, h, 2.0, 64, 8, cl, {"nodes": 4, "dispatch_bytes": None})
    fp8 = cm.dispatch_combine_time(T, k, h, 2.0, 64, 8, cl, {"nodes": 4, "dispatch_bytes": 1.0})
    leg = cm.node_limited_time(T, k, h * 2.0, 64, 8, 4, cl)
    assert bf16 == pytest.approx((2 * leg, 2 * leg))
    assert fp8 == pytest.approx((1.5 * leg, 1.5 * leg))       # dispatch at half, combine unchanged
    # without the routing the plain all-to-all at bf16, as before
    assert cm.dispatch_combine_time(T, k, h, 2.0, 64, 8, cl) == pytest.approx(
        (2 * cm.all_to_all_time(T * k * h * 2.0, 64, 8, cl),) * 2)


def test_an_ep_rank_reads_only_its_own_experts_weights():
    cl, s = Cluster.parse("h800"), CostSettings(runtime="fused")
    fl, wb, rb = 2.0 * 4096 * 7168 * 4096, 256 * 7168 * 4096 * 2.0, 4096 * (7168 + 4096) * 2.0
    # ep 1: every expert's weights; ep 64: 1/64 of them over the same rows (FLOPs unchanged at load 1)
    df, db = cm.expert_gemm_delta([(fl, wb, rb)], 1, 64, 1, 1.0, cl, s)
    eff = cl.compute_efficiency
    before = compute_time(fl, wb + rb, cl, efficiency=eff, overlap=cl.gemm_memory_overlap)
    after = compute_time(fl, wb / 64 + rb, cl, efficiency=eff, overlap=cl.gemm_memory_overlap)
    assert df == pytest.approx(after - before) and df < 0
    assert db == pytest.approx(compute_time(2 * fl, 2 * (wb / 64 + rb), cl, efficiency=eff, overlap=0.0)
                               - compute_time(2 * fl, 2 * (wb + rb), cl, efficiency=eff, overlap=0.0))
    assert cm.expert_gemm_delta([(fl, wb, rb)], 1, 1, 1, 1.0, cl, s) == (0.0, 0.0)


def _mla(**kw):
    return dict(q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, **kw)


def test_deepseek_v3_zoo_entry_has_mla_and_the_published_sizes():
    c = zoo.info("deepseek-v3")["config"]
    h, a = 7168, 128
    mla = h * 1536 + 1536 + 1536 * a * 192 + h * 576 + 512 + 512 * a * 256 + a * 128 * h     # section 2.1.1 dims
    attn = mla + 2 * h
    expert = 3 * h * 2048
    total = 61 * attn + 3 * 3 * h * 18432 + 58 * (h * 256 + 257 * expert) + 2 * 129280 * h + h
    assert zoo.info("deepseek-v3")["params"] == total
    assert total == pytest.approx(671e9, rel=0.005)                 # the report's 671B (MTP module apart)
    active = zoo.BUILDERS["moe"][1](**c, active=True)
    assert active == pytest.approx(37e9, rel=0.02)                  # 37B activated
    m = MoEModel(l=2, h=32, a=4, kv=4, V=64, s=16, ffn=64, experts=8, top_k=2, expert_ffn=16, shared=1, dense=1, mla=_mla())
    assert sum(p.numel() for p in m.parameters()) == zoo.BUILDERS["moe"][1](
        l=2, h=32, a=4, kv=4, V=64, s=16, ffn=64, experts=8, top_k=2, expert_ffn=16, shared=1, dense=1, mla=_mla())


def test_group_limited_routing_keeps_a_token_on_its_best_groups():
    torch.manual_seed(0)
    m = MoEModel(l=1, h=32, a=4, kv=4, V=64, s=16, ffn=64, experts=8, top_k=4, expert_ffn=16, n_group=4, topk_group=2)
    moe = m.layers[0].moe
    probs = torch.softmax(torch.randn(64, 8), dim=-1)
    kept = moe._group_limited(probs)
    groups = (kept.topk(4, dim=-1).indices // 2)                     # 2 experts a group
    assert all(len(set(r.tolist())) <= 2 for r in groups)
    free = probs.topk(4, dim=-1).indices // 2
    assert any(len(set(r.tolist())) > 2 for r in free)              # the limit changed some tokens' choice


def test_captured_facts_read_the_expert_top_k_and_the_routing():
    from types import SimpleNamespace
    from sapp.search.joint.ep import moe_facts
    m = MoEModel(l=2, h=32, a=4, kv=4, V=64, s=16, ffn=64, experts=8, top_k=3, expert_ffn=16, dense=1,
                 n_group=4, topk_group=2, mla=_mla())
    g = capture(m, (torch.randint(0, 64, (2, 16)),))
    g.meta["config"] = {"n_group": 4, "topk_group": 2, "dispatch_fp8": True}
    f = moe_facts(SimpleNamespace(graph=g, settings=CostSettings(runtime="fused")))["layers.1"]
    assert f["top_k"] == 3 and f["rows"] == 16 * 3                  # not the router's group choice (top-2 groups)
    assert (f["n_group"], f["topk_group"], f["dispatch_fp8"]) == (4, 2, True)
    # sapp run's all-to-all sends bf16: under its (eager) runtime the FP8 dispatch is not priced
    assert moe_facts(SimpleNamespace(graph=g, settings=CostSettings()))["layers.1"]["dispatch_fp8"] is False
    assert len(f["gemms"]) == 2 and g.meta["unknown_ops"] == []
