"""A Hugging Face decoder's architecture as an engine must build it (sapp/engines/arch.py's dict), read
through transformers' own config class (the one the capture built the priced model from, so a
config.json written by transformers 5 (`rope_parameters`, `layer_types`) means what it meant there).

FIELDS classifies every field of the config classes of the decoders sapp writes engine models for:
"carried" (the export states it; arch key in the second place), "refused" (the export refuses in one
line unless the value is the one given, the engine's only behaviour), or "irrelevant" (why).  A field
the classes have and FIELDS lacks is a test failure (tests/test_engines_arch.py), never a silent drop."""
from __future__ import annotations

from .mapping import EngineError

# HF model types whose decoder Megatron's GPT builds: pre-norm blocks (RMSNorm or LayerNorm), SwiGLU (or
# GELU for Starcoder2), rotary embeddings (partial for StableLM / Phi-3), per-head q/k RMSNorm for Qwen3,
# multi-latent attention and sigmoid group-limited routing for DeepSeek-V3 (sapp/engines/arch_mla.py)
LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "stablelm",
              "starcoder2", "deepseek_v3")
# the catalogue's other decoders, each with the first field Megatron-Core's GPT (core_v0.16.1) cannot state:
# the export refuses naming it (a type not listed is refused by its model type)
UNSTATED = {
    "gemma": "hidden_act gelu_pytorch_tanh (a GeGLU with tanh GELU; Megatron's GLU is SwiGLU or quick-GeGLU), "
             "RMSNorm (1 + weight) and embeddings scaled by sqrt(hidden_size)",
    "gemma2": "attn_logit_softcapping / final_logit_softcapping (Megatron-Core caps no logits)",
    "gemma3_text": "attn_logit_softcapping / final_logit_softcapping, query_pre_attn_scalar and a rope per layer type",
    "gemma3n_text": "altup / laurel blocks and per-layer inputs",
    "olmo": "a layer norm without weights (Megatron's norms have them)",
    "olmo2": "q_norm / k_norm over all heads and norms after each sublayer (Megatron's qk-layernorm is per head, "
             "its blocks pre-norm)",
    "olmo3": "q_norm / k_norm over all heads and norms after each sublayer",
    "olmoe": "q_norm / k_norm over the whole projection (Megatron's --qk-layernorm normalises each head)",
    "deepseek_v2": "kv_lora_rank / q_lora_rank (multi-latent attention: sapp writes no --multi-latent-attention)",
    "gpt_neox": "use_parallel_residual (attention and MLP side by side; Megatron-Core's blocks are sequential)",
    "falcon": "parallel_attn / new_decoder_architecture (attention and MLP side by side) or alibi",
    "cohere": "a parallel attention + MLP block and logit_scale",
    "cohere2": "a parallel attention + MLP block and logit_scale",
    "granite": "embedding_multiplier / residual_multiplier / attention_multiplier / logits_scaling",
    "granitemoe": "embedding_multiplier / residual_multiplier / attention_multiplier / logits_scaling",
    "granitemoeshared": "embedding_multiplier / residual_multiplier / attention_multiplier / logits_scaling",
    "phi": "partial rotary with a parallel attention + MLP block (Megatron-Core's blocks are sequential)",
    "gpt2": "activation_function gelu_new (tanh GELU; Megatron-Core's GPT applies exact GELU)",
    "gptj": "a parallel attention + MLP block and interleaved partial rotary",
}
C, R, I = "carried", "refused", "irrelevant"        # noqa: E741
_META = (I, "bookkeeping of the config file or of HF's generation / output API: not the model's computation")
FIELDS = {
    "num_hidden_layers": (C, "layers"), "hidden_size": (C, "hidden"), "num_attention_heads": (C, "heads"),
    "num_key_value_heads": (C, "kv_heads"), "head_dim": (C, "head_dim"), "intermediate_size": (C, "ffn"),
    "vocab_size": (C, "vocab"), "max_position_embeddings": (C, "max_pos"), "rms_norm_eps": (C, "norm_eps"),
    "tie_word_embeddings": (C, "tied"), "rope_parameters": (C, "rope_base rope_scaling"),
    "sliding_window": (C, "window"), "use_sliding_window": (C, "window"), "max_window_layers": (C, "window_layers"),
    "layer_types": (C, "window_layers"), "attention_dropout": (C, "attention_dropout"),
    "num_local_experts": (C, "experts"), "num_experts_per_tok": (C, "top_k"),
    "hidden_act": (R, "silu"), "attention_bias": (R, False), "mlp_bias": (R, False), "router_jitter_noise": (R, 0.0),
    # Qwen2-MoE (_qwen2_moe): routed experts, a shared expert behind a sigmoid gate (--moe-shared-expert-gate),
    # MoE on some layers (--moe-layer-freq), top-k not renormalised (--moe-router-pre-softmax), q/k/v biases
    "num_experts": (C, "experts"), "moe_intermediate_size": (C, "expert_ffn"),
    "shared_expert_intermediate_size": (C, "shared_ffn shared_gate"), "decoder_sparse_step": (C, "moe_layers"),
    "mlp_only_layers": (C, "moe_layers"), "norm_topk_prob": (C, "router_pre_softmax"), "qkv_bias": (C, "qkv_bias"),
    # Qwen3 / Qwen3-MoE: q_norm / k_norm, an RMSNorm over each head's width (Megatron's --qk-layernorm)
    # StableLM: LayerNorm, partial rotary (--rotary-percent), q/k/v biases (--add-qkv-bias)
    "layer_norm_eps": (C, "norm_eps"), "use_qkv_bias": (C, "qkv_bias"), "qk_layernorm": (R, False),
    "use_parallel_residual": (R, False), "hidden_dropout": (R, 0.0),
    # Phi-3: fused q/k/v and gate/up projections (the same function as separate ones), a window, partial rotary
    "resid_pdrop": (R, 0.0), "embd_pdrop": (I, "transformers' Phi-3 reads it nowhere (no embedding dropout)"),
    "original_max_position_embeddings": (I, "read by the longrope scaling only, which is refused"),
    # Starcoder2: LayerNorm with biases, a GELU MLP (c_fc / c_proj), biases on every linear (use_bias)
    "norm_epsilon": (C, "norm_eps"), "use_bias": (C, "bias qkv_bias"), "residual_dropout": (C, "hidden_dropout"),
    "embedding_dropout": (C, "hidden_dropout"),
    # DeepSeek-V3 (arch_mla.py): multi-latent attention, sigmoid routing over groups, shared experts, dense first
    **{k: (C, "mla") for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                               "qk_head_dim")},
    **{k: (C, "experts routing") for k in ("n_routed_experts", "n_shared_experts", "routed_scaling_factor", "n_group",
                                           "topk_group", "first_k_dense_replace")},
    "rope_interleave": (I, "rope on interleaved channel pairs: the same function as Megatron's halves with the "
                           "rope channels of the latent projections permuted"),
    "num_nextn_predict_layers": (I, "transformers builds no multi-token-prediction layer (nor does the export)"),
    "pretraining_tp": (I, "Llama's sliced projections for reproducing pretraining numerics: the same function"),
    "output_router_logits": (I, "whether HF returns the router logits (and adds its load-balancing loss: a "
                                "scalar beside the step, as Megatron's --moe-aux-loss-coeff is)"),
    "router_aux_loss_coef": (I, "the weight of that auxiliary loss: a scalar, no work in the step"),
    "initializer_range": (I, "parameter initialization before training"),
    "chunk_size_feed_forward": (I, "HF's chunked feed-forward for inference memory: the same computation"),
    "use_cache": (I, "the generation KV cache: none in a training step"),
    **{k: _META for k in ("_name_or_path", "architectures", "bos_token_id", "eos_token_id", "pad_token_id", "dtype",
                          "id2label", "label2id", "is_encoder_decoder", "model_type", "output_attentions",
                          "output_hidden_states", "problem_type", "return_dict", "transformers_version")},
}
# Megatron-Core's Llama 3 rope scaling (rotary_pos_embedding._apply_scaling, core_v0.16.1): only the factor
# is an argument (--rope-scaling-factor); the rest are fixed at Llama 3's values
LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def torchtitan_attention_agrees(arch) -> bool:
    """Whether torchtitan's llama3 model computes this architecture's attention: full attention (it has no
    window) and its one rope scaling (models/llama3/model/args.py RoPEScalingArgs: Llama 3's, factor 8,
    always applied), or none stated (a zoo model's, which states none)."""
    return unlike_llama3_attention(arch) is None


def unlike_llama3(arch):
    """The first field of `arch` torchtitan's llama3 builds otherwise (its flavors: RMSNorm, SwiGLU, rope
    base 500000, no biases, no experts, vocabulary 128256, head width hidden / heads), or None."""
    for bad, why in ((arch["norm"] != "RMSNorm", f"norm {arch['norm']}"), (not arch["glu"], "activation (not SwiGLU)"),
                     (arch["position"] != "rope", f"position embedding {arch['position']}"),
                     (arch["bias"], "linear biases"), (arch["qkv_bias"], "q/k/v biases"),
                     (arch.get("experts"), f"{arch.get('experts')} experts (torchtitan's llama3 is dense)"),
                     (arch["vocab"] != 128256, f"vocab_size {arch['vocab']} (torchtitan's llama3: 128256)"),
                     (arch["head_dim"] * arch["heads"] != arch["hidden"], f"head_dim {arch['head_dim']}"),
                     (arch.get("rope_base") != 500000, f"rope_theta {arch.get('rope_base')} (torchtitan's llama3: 500000)")):
        if bad:
            return why
    return unlike_llama3_attention(arch)


def unlike_llama3_attention(arch):
    """The first field of `arch` whose attention torchtitan's llama3 computes otherwise (named as the
    HF config names it), or None.  An HF config that states no rope scaling differs: torchtitan 0.2.2's
    precompute_freqs_cis always applies RoPEScalingArgs (factor 8), so Llama 3 8B's own config (no
    rope_scaling) was written as flavor 8B and trained with another rope (issue 52)."""
    rs = arch.get("rope_scaling")
    if arch.get("window"):
        return f"sliding_window {arch['window']} (torchtitan's llama3 attends in full)"
    if arch.get("qk_norm"):
        return "q_norm / k_norm (torchtitan's llama3 normalises no query or key)"
    if arch.get("rotary_percent", 1.0) != 1.0:
        return f"partial_rotary_factor {arch['rotary_percent']:g} (torchtitan's llama3 rotates every channel)"
    if arch.get("hidden_dropout"):
        return f"residual dropout {arch['hidden_dropout']:g} (torchtitan's llama3 has none)"
    if arch.get("attention_dropout"):
        return f"attention_dropout {arch['attention_dropout']:g} (torchtitan's llama3 has none)"
    if abs(arch.get("norm_eps", 1e-5) - 1e-5) > 1e-12:
        return f"rms_norm_eps {arch['norm_eps']:g} (torchtitan's llama3: 1e-05)"
    if not rs:
        return ("rope scaling none (torchtitan's llama3 always applies Llama 3's, factor 8)"
                if "rope_scaling" in arch else None)
    try:
        factor = rope_factor(rs)
    except EngineError as e:
        return str(e).split(":", 1)[0]
    return None if factor == 8.0 else f"rope_parameters.factor {factor:g} (torchtitan's llama3: 8)"


def config_of(path: str):
    """transformers' config of the plan's config.json (read as data: AutoConfig.for_model, no code)."""
    from ..models.hf import HFConfigError, load_config
    try:
        return load_config(path, {})
    except HFConfigError as e:
        raise EngineError(f"{e}; export where the config.json the plan was searched with is") from None


def _rope(cfg):
    """(base, scaling dict or None): transformers 5's rope_parameters, or 4.x's rope_theta / rope_scaling."""
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and any(isinstance(v, dict) for v in rp.values()):
        raise EngineError("rope_parameters: a rope per layer type; Megatron states one rope: export to deepspeed")
    if isinstance(rp, dict):
        base, kind = rp.get("rope_theta", 10000.0), rp.get("rope_type", "default")
        scaling = {k: v for k, v in rp.items() if k not in ("rope_theta", "partial_rotary_factor")} \
            if kind != "default" else None
    else:
        base, scaling = getattr(cfg, "rope_theta", 10000.0), getattr(cfg, "rope_scaling", None)
        if scaling and scaling.get("rope_type", scaling.get("type")) == "default":
            scaling = None
    return float(base), scaling


def rope_factor(scaling) -> float | None:
    """The factor of HF's Llama 3 rope scaling (the one scaling Megatron-Core and torchtitan's llama3
    apply), or a one-line refusal naming the field (another rope type, or a Llama 3 field they fix)."""
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "llama3":
        raise EngineError(f"rope_parameters.rope_type {kind!r}: Megatron-Core's GPT states Llama 3's rope scaling only "
                          f"(--use-rope-scaling; its linear interpolation and yarn are not passed by "
                          f"pretrain_gpt's builder for this attention); export to deepspeed")
    for k, v in LLAMA3_FIXED.items():
        if float(scaling.get(k, v)) != v:
            raise EngineError(f"rope_parameters.{k} {scaling[k]}: Megatron-Core's Llama 3 rope scaling fixes it at "
                              f"{v:g} (only the factor is an argument); export to deepspeed")
    return float(scaling.get("factor", 8.0))


def _window(cfg, layers):
    """(window in tokens or None, [True where a layer attends within it] or None when every layer does)."""
    w = getattr(cfg, "sliding_window", None)
    if getattr(cfg, "use_sliding_window", None) is False:
        w = None
    types = getattr(cfg, "layer_types", None)
    if not w:
        if types and "sliding_attention" in types:
            raise EngineError("layer_types has sliding_attention layers but sliding_window is unset; fix the config")
        return None, None
    if not types:
        return int(w), None
    bad = sorted(set(types) - {"sliding_attention", "full_attention"})
    if bad or len(types) != layers:
        raise EngineError(f"layer_types {bad or len(types)}: Megatron states sliding or full attention per layer, "
                          f"one per layer; export to deepspeed")
    mask = [t == "sliding_attention" for t in types]
    return (int(w), None if all(mask) else mask) if any(mask) else (None, None)


def refuse_type(mt) -> None:
    """A one-line refusal of a decoder type sapp writes no engine model of, naming what the engine lacks."""
    if mt not in LLAMA_LIKE:
        why = f" ({mt}'s {UNSTATED[mt]})" if mt in UNSTATED else ""
        raise EngineError(f"HF model type {mt!r}{why}: sapp writes engine models for {', '.join(LLAMA_LIKE)} "
                          f"decoders; export to deepspeed, which trains your own module")


# per model type: (norm, its epsilon's field, gated MLP); absent: Llama's (RMSNorm, rms_norm_eps, SwiGLU)
_TYPES = {"stablelm": ("LayerNorm", "layer_norm_eps", True), "starcoder2": ("LayerNorm", "norm_epsilon", False)}
# fields that must hold Megatron's only behaviour (FIELDS' value) on each type that has them
_FIXED = ("hidden_act", "attention_bias", "mlp_bias", "router_jitter_noise", "qk_layernorm", "use_parallel_residual",
          "hidden_dropout", "resid_pdrop")


def read(path: str, raw: dict, seq) -> dict:
    """The architecture of the decoder at `path` (see the module doc); EngineError names the field."""
    mt = raw.get("model_type")
    refuse_type(mt)
    cfg = config_of(path)
    g = cfg.__getattribute__
    norm, eps, glu = _TYPES.get(mt, ("RMSNorm", "rms_norm_eps", True))
    h, heads, L = int(g("hidden_size")), int(g("num_attention_heads")), int(g("num_hidden_layers"))
    base, scaling = _rope(cfg)
    window, pattern = _window(cfg, L)
    a = dict(layers=L, hidden=h, heads=heads, kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
             head_dim=int(getattr(cfg, "head_dim", None) or h // heads), ffn=int(g("intermediate_size")),
             vocab=int(g("vocab_size")), seq=seq, max_pos=int(getattr(cfg, "max_position_embeddings", None) or seq),
             norm=norm, norm_eps=float(g(eps)), glu=glu, act=g("hidden_act"), position="rope",
             rope_base=base, bias=False, qkv_bias=_qkv_bias(mt, cfg), tied=bool(getattr(cfg, "tie_word_embeddings", False)),
             attention_dropout=float(getattr(cfg, "attention_dropout", 0.0) or 0.0))
    if mt in ("qwen3", "qwen3_moe"):
        a["qk_norm"] = True              # Qwen3RMSNorm(head_dim) on each head's query and key, before rope
    rp = getattr(cfg, "rope_parameters", None)
    part = float((rp or {}).get("partial_rotary_factor", 1.0)) if isinstance(rp, dict) else 1.0
    if part != 1.0:
        a["rotary_percent"] = part       # rope on the first part of each head's width (Megatron's --rotary-percent)
    if window:
        a["window"] = window
        if pattern:
            a["window_layers"] = pattern
    # (stated even when None: a config without rope scaling says so, unlike a zoo model, which states none)
    a["rope_scaling"] = dict(scaling) if scaling else None
    if scaling:
        rope_factor(scaling)                     # refused here, before anything is written
    if mt == "starcoder2":
        a.update(_starcoder2(path, cfg))
    for k in _FIXED:
        v = getattr(cfg, k, FIELDS[k][1])
        want = "gelu" if k == "hidden_act" and not glu else FIELDS[k][1]
        if v != want:
            raise EngineError(f"{path}: {k} {v!r} on a {mt} model has no Megatron flag (Megatron builds "
                              f"{want!r}); export to deepspeed")
    if mt == "mixtral":
        a.update(experts=int(g("num_local_experts")), top_k=int(g("num_experts_per_tok")), expert_ffn=a["ffn"],
                 shared_ffn=0, dense_layers=0)
    if mt in ("qwen2_moe", "qwen3_moe"):
        a.update(_qwen2_moe(path, cfg, L))
    if mt == "deepseek_v3":
        from .arch_mla import deepseek_v3
        a.update(deepseek_v3(path, cfg, L))
    if a.get("top_k") == 1 and not a.get("router_pre_softmax"):
        # Megatron-Core's TransformerConfig raises "use --moe-router-pre-softmax when topk is 1" (core_v0.16.1),
        # which weights the one expert by its softmax probability; HF renormalises the top-k, so a weight of 1
        raise EngineError(f"{path}: num_experts_per_tok 1 with renormalised routing: Megatron-Core routes top-1 only "
                          f"with --moe-router-pre-softmax (another expert weight); export to deepspeed")
    return a


def _qkv_bias(mt, cfg) -> bool:
    """Biases on q/k/v alone (Megatron's --add-qkv-bias): Qwen2 always, Qwen2-MoE by qkv_bias, StableLM by
    use_qkv_bias (Starcoder2's biases on every linear are its `bias`)."""
    if mt == "qwen2":
        return True
    if mt == "qwen2_moe":
        return bool(getattr(cfg, "qkv_bias", True))
    return bool(getattr(cfg, "use_qkv_bias", False)) or (mt == "starcoder2" and bool(cfg.use_bias))


def _starcoder2(path, cfg) -> dict:
    """Starcoder2's biases (use_bias: every linear, Megatron's default) and its one dropout on the
    embedding and on each sublayer's output (Megatron's --hidden-dropout does both)."""
    res, emb = float(cfg.residual_dropout or 0.0), float(cfg.embedding_dropout or 0.0)
    if res != emb:
        raise EngineError(f"{path}: residual_dropout {res:g} beside embedding_dropout {emb:g}: Megatron's "
                          f"--hidden-dropout is one rate for both; export to deepspeed")
    return {"bias": bool(cfg.use_bias), "hidden_dropout": res}


def _qwen2_moe(path, cfg, layers) -> dict:
    """Qwen2-MoE's MoE half (transformers' Qwen2MoeDecoderLayer: a layer is MoE unless listed in
    mlp_only_layers, every decoder_sparse_step-th; its dense layers use intermediate_size)."""
    E, skip, step = int(cfg.num_experts), set(cfg.mlp_only_layers or ()), int(cfg.decoder_sparse_step)
    # (Qwen3-MoE has no shared expert: None)
    shared = int(cfg.shared_expert_intermediate_size) if hasattr(cfg, "shared_expert_intermediate_size") else None
    moe = [i not in skip and E > 0 and (i + 1) % step == 0 for i in range(layers)]
    if not any(moe):
        raise EngineError(f"{path}: num_experts / mlp_only_layers / decoder_sparse_step leave no MoE layer; "
                          f"write it as a qwen2 config, or export to deepspeed")
    if shared is not None and shared <= 0:
        raise EngineError(f"{path}: shared_expert_intermediate_size {shared}: HF still builds the shared expert's gate, "
                          f"which Megatron builds only beside a shared expert; export to deepspeed")
    d = moe.index(True)
    out = dict(experts=E, top_k=int(cfg.num_experts_per_tok), expert_ffn=int(cfg.moe_intermediate_size),
               shared_ffn=shared or 0, shared_gate=shared is not None, dense_layers=layers - sum(moe))
    if moe != [False] * d + [True] * (layers - d):
        out["moe_layers"] = moe
    if not cfg.norm_topk_prob:
        out["router_pre_softmax"] = True
    return out
