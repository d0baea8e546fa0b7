"""MoE priced as what it is, and scaled-up HF configs priced right: expert GEMMs as GEMMs over the
routed rows (tokens x top-k), routing ops known and split per data shard; Llama-7B-like and
Mixtral-8x7B-like configs on meta give a plan whose model FLOPs are within 5% of an independent hand
count (6·N_active·tokens + attention) and search within a few times the zoo's own 7B GPT."""
import time

import pytest
import torch

transformers = pytest.importorskip("transformers")

from sapp.api import search  # noqa: E402
from sapp.capture import capture  # noqa: E402
from sapp.models.data import token_loss  # noqa: E402
from tests.hf_tiny import BATCH, SEQ, build  # noqa: E402

SEARCH_BUDGET_S = 3.0


def test_expert_gemms_are_gemms_over_the_routed_rows():
    m, inputs, cfg = build("mixtral")
    g = capture(m, inputs)
    T, k, E, h, f = BATCH * SEQ, cfg.num_experts_per_tok, cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
    experts = [n for n in g.nodes.values() if n.extra.get("experts")]
    assert len(experts) == 2 * cfg.num_hidden_layers                    # gate_up and down per layer
    for n in experts:
        assert n.kind == "matmul" and n.extra["experts"] == E
        assert n.extra["rows_per_expert"] == pytest.approx(T * k / E)  # the batch of tokens per expert
        assert n.dim("b0").size == T * k and n.dim("b0").batch
        # experts stay whole (no expert or expert-tensor parallelism is emitted yet)
        assert [d.name for d in n.dims if d.splittable] == ["b0"]
    # hand count per layer: gate_up [T·k, h] x [h, 2f] and down [T·k, f] x [f, h], 2 FLOPs per MAC
    per_layer = 2 * T * k * h * 2 * f + 2 * T * k * f * h
    assert sum(n.flops for n in experts) == cfg.num_hidden_layers * per_layer
    ops = {n.target.split(".")[1] for n in g.nodes.values() if n.module.endswith((".mlp.gate", ".mlp.experts"))}
    assert {"topk", "softmax", "sort", "histc", "index_put_", "index"} <= ops
    assert g.meta["unknown_ops"] == []


def test_routing_splits_along_the_batch_under_data_parallelism():
    m, inputs, cfg = build("mixtral")
    ids = torch.empty(8, SEQ, dtype=torch.long, device="meta")
    plan = search(m, "cpu:gpus=2", global_batch=8, example_inputs=(ids,), constraints={"dp": 2, "tp": 1, "pp": 1})
    routed = {name: op for name, op in plan.operators.items() if op["module"].endswith((".mlp.experts", ".mlp.gate"))
              and name.rstrip("_0123456789").rstrip("_") in ("topk", "sort", "index", "index_put", "histc",
                                                               "grouped_mm_fallback")}
    assert len(routed) == 9 * cfg.num_hidden_layers        # topk, sort, 3 index, histc, index_put, 2 GEMMs
    # every routing op and expert GEMM splits its rows over the dp level: each replica routes its own
    # tokens (no gather of the batch into a router); the histogram of a shard is a partial count
    assert all(op["split"][0] is not None for op in routed.values()), routed
    assert all(op["out"] == ["P"] for name, op in routed.items() if name.startswith("histc"))


def _hand_flops(cfg, global_batch, seq):
    """6·N_active·tokens + attention, N_active from the config by formula (not from the model)."""
    h, L, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    E = getattr(cfg, "num_local_experts", 0)
    mlp = cfg.num_experts_per_tok * 3 * h * cfg.intermediate_size + h * E if E else 3 * h * cfg.intermediate_size
    n_active = L * (2 * h * h + 2 * h * kv + mlp) + V * h          # q, o, k, v; MLP; lm_head
    return 6 * n_active * global_batch * seq + 3 * 4 * global_batch * seq * seq * h * L


def _scaled(name):
    T = transformers
    common = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, vocab_size=32000,
                  max_position_embeddings=4096, use_cache=False, tie_word_embeddings=False)
    if name == "llama-7b":
        return T.LlamaConfig(intermediate_size=11008, num_key_value_heads=32, **common), T.LlamaForCausalLM
    return T.MixtralConfig(intermediate_size=14336, num_key_value_heads=8, num_local_experts=8,
                           num_experts_per_tok=2, **common), T.MixtralForCausalLM


@pytest.fixture(scope="module")
def zoo_search_s():
    """The zoo's GPT-3 6.7B searched on the same preset here: the speed this box gives a 7B search."""
    import sapp.models as zoo
    g = capture(zoo.get("gpt3-6.7b"), batch=8)
    t0 = time.process_time()       # CPU seconds: the other worker's load does not stretch them
    search(zoo.get("gpt3-6.7b"), "h100-80g:nodes=8", global_batch=256, graph=g)
    return time.process_time() - t0


@pytest.mark.parametrize("name, cluster", [("llama-7b", "a100-80g:nodes=8"), ("mixtral-8x7b", "h100-80g:nodes=8")])
def test_scaled_up_configs_flops_and_search_time(name, cluster, zoo_search_s):
    cfg, cls = _scaled(name)
    seq, gb = 4096, 256
    with torch.device("meta"):
        m = cls(cfg)
    ids = torch.empty(8, seq, dtype=torch.long, device="meta")
    g = capture(m, (ids,), target=ids, loss_fn=token_loss)
    assert g.meta["capture"] == "export+replicate" and g.meta["unknown_ops"] == []
    t0 = time.process_time()
    plan = search(m, cluster, global_batch=gb, graph=g)
    search_s = time.process_time() - t0
    hand = _hand_flops(cfg, gb, seq)
    err = plan.predicted["model_flops"] / hand - 1
    print(f"{name} on {cluster}: search {search_s:.2f} s (zoo gpt3-6.7b {zoo_search_s:.2f} s here), "
          f"model FLOPs {plan.predicted['model_flops']:.4e} vs hand {hand:.4e} ({100 * err:+.3f}%)")
    assert abs(err) < 0.05
    # The target is 3 s; a shared CI box slows every search alike, so the guard is relative to the
    # zoo's 7B GPT searched here, both in CPU seconds (wall time stretched 4x under the suite's other worker): HF graphs have 1.5x (Llama) to 3x (Mixtral: routing) its nodes per
    # block and search 1.8-3.9x as long (bench/hf_scale.py); blocks that stop being grouped as
    # identical (one search per layer) took 18x, which this catches.
    assert search_s <= max(SEARCH_BUDGET_S, 5.0 * zoo_search_s)
