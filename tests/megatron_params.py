"""Megatron-Core's own parameter count of the GPT model an argument file describes (run as a script:
argument text on stdin, JSON {"total", "active"} on stdout, or a JSON list of argument texts in and a
list of those out; tests/test_engines_params.py).

The flags are turned into TransformerConfig and GPTModel arguments the way Megatron-LM's
arguments.py / core_transformer_config_from_args do (--swiglu: gated silu; --normalization;
--disable-bias-linear; --add-qkv-bias; --group-query-attention; --kv-channels; MoE flags; vocabulary
padded to a multiple of --make-vocab-size-divisible-by x tp).  Method: the model is really built, on the
meta device, with 1 and with 2 (+ dense) layers; the 2-layer count minus the 1-layer count is a layer's
parameters, and the whole model is the 1-layer model plus (num_layers - 1) more layers (every layer of a
GPT decoder has the same modules), so a 175B model is counted without building 96 layers.  Experts are
built as Megatron's SequentialMLP (the grouped GEMM's weights hold the same numbers of values).  Active
parameters: the routed experts' parameters scaled by top-k / experts."""
from __future__ import annotations

import json
import math
import os
import sys


def _build(a, layers, moe_layers):
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    def i(flag, default=None):
        return int(a[flag]) if flag in a else default
    E = i("--num-experts")
    kw = dict(num_layers=layers, hidden_size=i("--hidden-size"), num_attention_heads=i("--num-attention-heads"),
              ffn_hidden_size=i("--ffn-hidden-size"), kv_channels=i("--kv-channels"),
              num_query_groups=i("--num-query-groups") if a.get("--group-query-attention") else None,
              normalization=a.get("--normalization", "LayerNorm"),
              add_bias_linear=not a.get("--disable-bias-linear"), add_qkv_bias=bool(a.get("--add-qkv-bias")),
              use_cpu_initialization=True, perform_initialization=False)
    if a.get("--swiglu"):
        kw.update(gated_linear_unit=True, activation_func=F.silu, bias_activation_fusion=False)
    if E:
        kw.update(num_moe_experts=E, moe_router_topk=i("--moe-router-topk"),
                  moe_ffn_hidden_size=i("--moe-ffn-hidden-size"),
                  # the dispatcher holds no parameters; the all-to-all one opens a CUDA stream when
                  # built, so the count is taken with the allgather one (the same modules otherwise)
                  moe_token_dispatcher_type="allgather",
                  moe_shared_expert_intermediate_size=i("--moe-shared-expert-intermediate-size"),
                  moe_shared_expert_gate=bool(a.get("--moe-shared-expert-gate")))
        kw["moe_layer_freq"] = [0] * (layers - moe_layers) + [1] * moe_layers
    cfg = TransformerConfig(**kw)
    tp = i("--tensor-model-parallel-size", 1)
    mult = i("--make-vocab-size-divisible-by", 128) * tp
    V = math.ceil(i("--vocab-size") / mult) * mult
    spec = get_gpt_layer_local_spec(num_experts=E, moe_grouped_gemm=bool(a.get("--moe-grouped-gemm")))
    if E:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
        spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False)
    with torch.device("meta"):
        m = GPTModel(cfg, spec, vocab_size=V, max_sequence_length=i("--max-position-embeddings"),
                     position_embedding_type=a.get("--position-embedding-type", "learned_absolute"),
                     share_embeddings_and_output_weights=not a.get("--untie-embeddings-and-output-weights"))
    total = sum(p.numel() for p in m.parameters())
    experts = sum(p.numel() for n, p in m.named_parameters() if ".experts." in n)
    return total, experts


def count(args_text: str) -> dict:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from sapp.engines.megatron import tokens
    a = tokens(args_text)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    if not dist.is_initialized():       # several files counted in one process
        dist.init_process_group("gloo", rank=0, world_size=1)
        ps.initialize_model_parallel(1, 1)
    L = int(a["--num-layers"])
    freq = a.get("--moe-layer-freq")
    dense = 0
    if freq and freq.startswith("([0]*"):
        dense = int(freq[len("([0]*"):].split("+")[0])
    base = max(dense, 0)
    # dense layers as the model has them (at most a few), then 1 and 2 MoE (or plain) layers
    t1, e1 = _build(a, base + 1, 1)
    t2, e2 = _build(a, base + 2, 2)
    per, per_e = t2 - t1, e2 - e1
    total = t1 + (L - base - 1) * per
    experts = e1 + (L - base - 1) * per_e
    E, k = int(a.get("--num-experts") or 1), int(a.get("--moe-router-topk") or 1)
    active = total - experts + experts * k // E if a.get("--num-experts") else total
    return {"total": total, "active": active}


if __name__ == "__main__":
    import warnings
    warnings.filterwarnings("ignore")
    text = sys.stdin.read()
    # one argument file, or a JSON list of them (one Megatron import for all: about 5 s each saved)
    texts = json.loads(text) if text.lstrip().startswith("[") else None
    print(json.dumps([count(t) for t in texts] if texts is not None else count(text)))
