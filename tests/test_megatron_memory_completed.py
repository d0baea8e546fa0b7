"""sapp/engines/megatron_estimate.py's `completed` estimate: Megatron's theoretical-memory formula with the terms
it leaves out (context parallelism, bf16 main_grads under --grad-reduce-in-bf16, full recomputation),
used by bench/megatron_accepts.py beside the release's own number.  Arithmetic only (milliseconds)."""
import pytest

from sapp.engines.megatron_estimate import MB, estimate

BASE = {"--num-layers": "8", "--hidden-size": "1024", "--num-attention-heads": "8", "--seq-length": "4096",
        "--tensor-model-parallel-size": "2", "--micro-batch-size": "1", "--use-distributed-optimizer": True}


def test_context_parallelism_holds_a_cp_share_of_the_tokens():
    cp2 = dict(BASE, **{"--context-parallel-size": "2"})
    half = dict(BASE, **{"--seq-length": "2048"})
    # Megatron's own formula ignores cp: cp 2 on 16 GPUs estimates the activations of the full sequence
    assert estimate(cp2, world_size=16, vocab=32000)["activation_mb"] == \
        pytest.approx(estimate(BASE, world_size=8, vocab=32000)["activation_mb"])
    got = estimate(cp2, world_size=16, vocab=32000, completed=True)["activation_mb"]
    assert got == pytest.approx(estimate(half, world_size=8, vocab=32000, completed=True)["activation_mb"])
    assert got < 0.6 * estimate(cp2, world_size=16, vocab=32000)["activation_mb"]
    # the distributed optimizer shards over dp x cp: cp 2, tp 2 on 16 GPUs (dp 4) shards it 8 ways,
    # as tp 2 alone on 16 GPUs (dp 8) does; Megatron's own formula divides by dp 4
    w = estimate(cp2, world_size=16, vocab=32000, completed=True)["weights_mb"]
    assert w == pytest.approx(estimate(BASE, world_size=16, vocab=32000)["weights_mb"])
    assert w < estimate(cp2, world_size=16, vocab=32000)["weights_mb"]

def test_bf16_main_grads_save_two_bytes_a_parameter():
    bf16 = dict(BASE, **{"--grad-reduce-in-bf16": True})
    fp32_w = estimate(bf16, world_size=8, vocab=32000)["weights_mb"]          # the release: 6 + 12/dp bytes
    assert fp32_w == pytest.approx(estimate(BASE, world_size=8, vocab=32000)["weights_mb"])
    dp = 4
    assert estimate(bf16, world_size=8, vocab=32000, completed=True)["weights_mb"] == \
        pytest.approx(fp32_w * (4 + 12 / dp) / (6 + 12 / dp))
    assert estimate(BASE, world_size=8, vocab=32000, completed=True)["weights_mb"] == pytest.approx(fp32_w)


def test_full_recomputation_keeps_each_recomputed_layers_input():
    none = estimate(BASE, world_size=8, vocab=32000, completed=True)["activation_mb"]
    block = dict(BASE, **{"--recompute-granularity": "full", "--recompute-method": "block", "--recompute-num-layers": "8"})
    unif = dict(block, **{"--recompute-method": "uniform", "--recompute-num-layers": "1"})
    b = estimate(block, world_size=8, vocab=32000, completed=True)["activation_mb"]
    assert b == pytest.approx(estimate(unif, world_size=8, vocab=32000, completed=True)["activation_mb"])
    s, h, tp, L = 4096, 1024, 2, 8
    saved = (s * h * (10 + 24 / tp) - 2 * s * h) * L * 1.05 / MB       # per layer: full terms -> its bf16 input
    assert none - b == pytest.approx(saved)
    half = dict(block, **{"--recompute-num-layers": "4"})
    assert estimate(half, world_size=8, vocab=32000, completed=True)["activation_mb"] == pytest.approx(none - saved / 2)


def test_a_measured_layer_replaces_only_the_layer_term():
    """`layer_sbh` (bench.published_engine_examples: Megatron-Core's own MoE layer measured) stands in for
    the formula's per-layer coefficient and nothing else: the formula's own coefficient gives its own
    number back, and the layers' share grows with the coefficient."""
    sp_sel = {"--sequence-parallel": True, "--recompute-granularity": "selective"}
    for args in (BASE, dict(BASE, **sp_sel)):
        own = estimate(args, world_size=8, vocab=32000)
        sp = bool(args.get("--sequence-parallel"))
        coef = 18 + 4 * 4 if sp else 10 + 24 / 2             # ffn 4h; tp 2
        same = estimate(args, world_size=8, vocab=32000, layer_sbh=coef)
        assert same["total_mb"] == pytest.approx(own["total_mb"])
        more = estimate(args, world_size=8, vocab=32000, layer_sbh=2 * coef)
        assert more["weights_mb"] == pytest.approx(own["weights_mb"])
        assert own["activation_mb"] < more["activation_mb"] < 2 * own["activation_mb"]
