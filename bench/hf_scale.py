"""Scaled-up Hugging Face configs on meta (Llama-7B-like, Mixtral-8x7B-like) searched on the a100 / h100
presets: capture and search wall times, and the plan's model FLOPs against a hand count
(6·N_active·tokens + attention).

    python -m bench.hf_scale            # prints one row per model x cluster

bench/RESULTS.md §5's run (2026-11-23, idle CPU box; seq 4096, global batch 256, 64 devices): search
1.59-2.01 s (Llama-7B-like, a100), 2.17-2.40 s (h100), 2.69-3.15 s (Mixtral-8x7B-like, a100), 2.45-2.65 s
(h100); predicted FLOPs +0.02% against the hand count for both (48.3 and 87.0 PFLOP per step).
"""
from __future__ import annotations

import time

SEQ = int(__import__("os").environ.get("SEQ", 4096))
GLOBAL_BATCH = 256
CLUSTERS = ("a100-80g:nodes=8", "h100-80g:nodes=8")


def llama7b():
    import transformers as T
    return T.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=32, vocab_size=32000, max_position_embeddings=SEQ, use_cache=False,
                         tie_word_embeddings=False), T.LlamaForCausalLM


def mixtral8x7b():
    import transformers as T
    return T.MixtralConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                           num_key_value_heads=8, vocab_size=32000, max_position_embeddings=SEQ, use_cache=False,
                           num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False), T.MixtralForCausalLM


MODELS = {"llama-7b": llama7b, "mixtral-8x7b": mixtral8x7b}


def active_params(cfg) -> float:
    """Parameters one token's forward multiplies by (GEMM weights only: the embedding lookup is not a
    GEMM, norms are negligible): attention q/k/v/o, the MLP (top-k experts + router for MoE), lm_head."""
    h, L, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    hd = h // cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads) * hd
    attn = h * h + 2 * h * kv + h * h
    f = cfg.intermediate_size
    E = getattr(cfg, "num_local_experts", 0)
    mlp = (cfg.num_experts_per_tok * 3 * h * f + h * E) if E else 3 * h * f
    return L * (attn + mlp) + V * h


def hand_flops(cfg, global_batch=GLOBAL_BATCH, seq=SEQ) -> float:
    """6·N_active·tokens + attention scores and values (QKᵀ and AV: 2·2·s²·h per sequence and layer,
    forward; x3 for forward + backward; the full s² square, as the captured sdpa is priced)."""
    tokens = global_batch * seq
    attn = 3 * 4 * global_batch * seq * seq * cfg.hidden_size * cfg.num_hidden_layers
    return 6 * active_params(cfg) * tokens + attn


def run_one(name, cluster, global_batch=GLOBAL_BATCH):
    import torch

    from sapp.api import search
    from sapp.capture import capture
    cfg, cls = MODELS[name]()
    with torch.device("meta"):
        model = cls(cfg)
    ids = torch.empty(8, SEQ, dtype=torch.long, device="meta")
    from sapp.models.data import token_loss
    t0 = time.perf_counter()
    graph = capture(model, (ids,), target=ids, loss_fn=token_loss)
    cap_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan = search(model, cluster, global_batch=global_batch, graph=graph)
    search_s = time.perf_counter() - t0
    pred = plan.predicted["model_flops"]
    hand = hand_flops(cfg, global_batch)
    return {"model": name, "cluster": cluster, "capture_s": cap_s, "search_s": search_s,
            "unknown_ops": len(graph.meta["unknown_ops"]), "model_flops": pred, "hand_flops": hand,
            "error": pred / hand - 1, "parallel": dict(plan.parallel), "step_s": plan.predicted["step_time_s"],
            "mfu": plan.predicted["mfu"]}


def zoo_reference(cluster):
    """The zoo's GPT-3 6.7B searched the same way: how fast this machine runs a 7B search (the load of a
    shared box slows every search alike)."""
    import sapp.models as zoo
    from sapp.api import search
    from sapp.capture import capture
    g = capture(zoo.get("gpt3-6.7b"), batch=8)
    t0 = time.perf_counter()
    search(zoo.get("gpt3-6.7b"), cluster, global_batch=GLOBAL_BATCH, graph=g)
    return time.perf_counter() - t0


def main():
    for cl in CLUSTERS:
        print(f"reference: zoo gpt3-6.7b on {cl} searches in {zoo_reference(cl):.2f} s on this machine", flush=True)
    print(f"{'model':<14} {'cluster':<18} {'capture':>8} {'search':>8} {'unknown':>7} {'pred PFLOP':>11} "
          f"{'hand PFLOP':>11} {'error':>7}  plan")
    for name in MODELS:
        for cl in CLUSTERS:
            r = run_one(name, cl)
            par = r["parallel"]
            print(f"{r['model']:<14} {r['cluster']:<18} {r['capture_s']:7.2f}s {r['search_s']:7.2f}s {r['unknown_ops']:>7} "
                  f"{r['model_flops'] / 1e15:11.1f} {r['hand_flops'] / 1e15:11.1f} {100 * r['error']:+6.2f}%  "
                  f"dp={par['dp']} tp={par['tp']} pp={par['pp']} step {r['step_s']:.2f}s MFU {100 * r['mfu']:.1f}%",
                  flush=True)


if __name__ == "__main__":
    main()
