"""Megatron-Core's `--recompute-modules mla_up_proj` priced (sapp/recompute/modules.py): multi-latent
attention's up-projections (q_b, kv_b) and the rotary embedding after them are rerun in backward, and
what the attention saves of its queries, keys and values is dropped; the compressed q and kv, the
rope key and the down-projections stay.  On the zoo's deepseek-v3 cut to 4 layers of 256 tokens, each
figure against a hand count; a model without MLA has no such module (refused on import as
Megatron-Core refuses it)."""
import pytest

from sapp.api import tp_search_fn
from sapp.capture import capture
from sapp.cluster import Cluster
from sapp.costmodel.settings import CostSettings
from sapp.models import zoo
from sapp.pipeline.profile import attention_core
from sapp.recompute.modules import missing_modules, mla_up_region, module_regions, search_candidates
from sapp.search.joint import joint_search

L, S = 4, 256


@pytest.fixture(scope="module")
def graph():
    return capture(zoo.get("deepseek-v3", l=L, s=S), batch=1)


def test_region_is_the_up_projections_up_to_the_attention(graph):
    assert len(graph.blocks) == L
    for block, names in graph.blocks.items():
        r = mla_up_region(graph, names)
        linears = {graph.nodes[n].module for n in r if graph.nodes[n].kind == "matmul"}
        assert linears == {f"{block}.attn.q_b", f"{block}.attn.kv_b"}, linears
        attn = next(n for n in names if graph.nodes[n].kind == "attention")
        assert set(graph.nodes[attn].producers) <= r          # q, k and v are made inside it
        assert attn not in r and not any(graph.nodes[n].kind == "norm" for n in r)
        assert module_regions(graph, names, attention_core)["mla_up_proj"] == r


def _priced(graph, mods):
    st = CostSettings(runtime="fused", recompute_modules=mods)
    pins = {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "zero": 1, "micro_batches": 1, "recompute": "selective"}
    res = joint_search(graph, Cluster.parse("h800:nodes=1"), global_batch=8, constraints=pins, settings=st,
                       search_fn=tp_search_fn(), ignore_capacity=True)
    return res.stages[0], res


def test_priced_as_the_attention_inputs_dropped_and_the_up_projections_rerun(graph):
    base, _ = _priced(graph, ("layernorm", "moe_act"))
    mla, res = _priced(graph, ("layernorm", "mla_up_proj", "moe_act"))
    c = zoo.info("deepseek-v3")["config"]
    m, a = c["mla"], c["a"]
    # per token and layer, bf16: q and k of nope + rope per head, v of v_head_dim per head
    qkv = 2 * a * (2 * (m["qk_nope_head_dim"] + m["qk_rope_head_dim"]) + m["v_head_dim"])
    assert base.memory["activations"] - mla.memory["activations"] == L * S * qkv
    # the rerun holds the two up-projection GEMMs' forward at least (at the datasheet peak)
    flops = 2 * S * L * (m["q_lora_rank"] * a * (m["qk_nope_head_dim"] + m["qk_rope_head_dim"])
                         + m["kv_lora_rank"] * a * (m["qk_nope_head_dim"] + m["v_head_dim"]))
    cl = Cluster.parse("h800:nodes=1")
    assert mla.recompute_s - base.recompute_s >= flops / cl.peak_flops
    assert res.step_time_s > 0


def test_a_model_without_mla_has_no_such_module():
    g = capture(zoo.get("mixtral-8x7b", l=2, s=128), batch=1)
    blocks = list(g.blocks.values())
    assert not any("mla_up_proj" in module_regions(g, names, attention_core) for names in blocks)
    assert missing_modules(g, blocks, ("layernorm", "mla_up_proj"), attention_core) == ["mla_up_proj"]
    assert all("mla_up_proj" not in mods for mods in search_candidates(g, attention_core))


def test_megatron_search_weighs_it_beside_the_cheap_moe_modules(graph):
    assert search_candidates(graph, attention_core)[0] == ("core_attn", "layernorm", "mla_up_proj", "moe_act")
