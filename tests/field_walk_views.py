"""What each side of tests/test_engines_field_walk.py computes, read independently of sapp's export code:

  hf_view        the architecture transformers builds from a config.json (its config class, and what its
                 modeling code reads: norms, biases, dropouts, qk-norm, partial rotary, MoE layers);
  megatron_view  the flags of an argument file as Megatron-LM core_v0.16.1 reads them (its recorded argument
                 table), into Megatron-Core's own TransformerConfig (which validates) and what its
                 pretrain_gpt builder (gpt_builders.py) passes to GPTModel;
  torchtitan_flavors  torchtitan 0.2.2's llama3 flavors, built by its own TransformerModelArgs.

The views share their keys, so the walk compares them key by key."""
from __future__ import annotations

import ast
import json
import math
import os
import sys

from tests import engine_validate

HERE = os.path.dirname(__file__)
ARGS = json.load(open(os.path.join(HERE, "data", "megatron_core_v0.16.1_args.json")))
# per model type: (norm, its epsilon's field, gated MLP) as transformers' modeling code builds it
NORMS = {"stablelm": ("LayerNorm", "layer_norm_eps", True), "starcoder2": ("LayerNorm", "norm_epsilon", False)}
# the dropout on each sublayer's output (and on the embedding: `emb`) as each modeling file applies it
RESID = {"stablelm": ("hidden_dropout", None), "phi3": ("resid_pdrop", None),
         "starcoder2": ("residual_dropout", "embedding_dropout")}


# ---- the HF model as transformers builds it: what every engine must compute ------------------------------
def hf_view(path):
    """The architecture transformers builds from `path`, keyed as the engines' views are."""
    from sapp.models.hf import load_config
    c = load_config(path, {})
    mt, g = c.model_type, (lambda k, d=None: getattr(c, k, d))
    L, h, a = c.num_hidden_layers, c.hidden_size, c.num_attention_heads
    rp = g("rope_parameters") or {}
    kind = rp.get("rope_type", "default")
    norm, eps, glu = NORMS.get(mt, ("RMSNorm", "rms_norm_eps", True))
    res, emb = RESID.get(mt, (None, None))
    v = dict(layers=L, hidden=h, heads=a, kv_heads=g("num_key_value_heads") or a, head_dim=g("head_dim") or h // a,
             vocab=c.vocab_size, norm=norm, norm_eps=g(eps), act=c.hidden_act if glu else f"{c.hidden_act} (ungated)",
             rope_base=float(rp.get("rope_theta", 10000.0)), rope_type=kind,
             rope_factor=float(rp.get("factor") or 1.0) if kind != "default" else None,
             rope_fixed={k: rp.get(k) for k in ("low_freq_factor", "high_freq_factor",
                                                "original_max_position_embeddings")} if kind != "default" else None,
             rotary_percent=float(rp.get("partial_rotary_factor", 1.0)),
             bias=bool(g("attention_bias") or g("mlp_bias") or (mt == "starcoder2" and c.use_bias)),
             tied=bool(c.tie_word_embeddings), attention_dropout=float(g("attention_dropout", 0.0) or 0.0),
             router_jitter=g("router_jitter_noise", 0.0), qk_norm=mt in ("qwen3", "qwen3_moe"),
             qk_norm_per_head_weights=bool(g("qk_layernorm")), parallel_residual=bool(g("use_parallel_residual")),
             hidden_dropout=float(g(res, 0.0) or 0.0) if res else 0.0,
             embedding_dropout=float(g(emb, 0.0) or 0.0) if emb else 0.0)
    v["qkv_bias"] = mt == "qwen2" or bool(g("qkv_bias")) or bool(g("attention_bias")) or bool(g("use_qkv_bias")) \
        or v["bias"]
    w, types = g("sliding_window"), g("layer_types")
    on = w and g("use_sliding_window") is not False
    v["window"] = [bool(on and (t == "sliding_attention" if types else True)) for t, _ in
                   zip(types or [None] * L, range(L))]
    v["window_size"] = w if any(v["window"]) else None
    v["ffn"] = c.intermediate_size
    if mt == "mixtral":
        v.update(experts=c.num_local_experts, top_k=c.num_experts_per_tok, expert_ffn=c.intermediate_size,
                 moe=[True] * L, shared_ffn=0, shared_gate=False, pre_softmax=False)
    elif mt in ("qwen2_moe", "qwen3_moe"):
        moe = [i not in set(c.mlp_only_layers or ()) and (i + 1) % c.decoder_sparse_step == 0 for i in range(L)]
        shared = g("shared_expert_intermediate_size") or 0          # (Qwen3-MoE: none)
        v.update(experts=c.num_experts, top_k=c.num_experts_per_tok, expert_ffn=c.moe_intermediate_size, moe=moe,
                 shared_ffn=shared, shared_gate=bool(shared), pre_softmax=not c.norm_topk_prob)
    return v


# ---- Megatron: the flags as Megatron-LM's parser reads them, into Megatron-Core's config ----------------
def namespace(text):
    """{dest: value} of an argument file as core_v0.16.1's parser reads it (its recorded table): an unknown
    flag fails here as argparse would."""
    from sapp.engines.megatron import tokens
    table = {f: row for row in ARGS["flags"] for f in row["flags"]}
    ns = {row["dest"]: row["default"] for row in ARGS["flags"]}
    for flag, val in tokens(text).items():
        row = table[flag]
        if row["nargs"] == 0:
            ns[row["dest"]] = not row["default"] if isinstance(row["default"], bool) else True
        else:
            d = row["default"]
            try:        # (a typed flag; moe_freq_type's list expressions stay text)
                ns[row["dest"]] = type(d)(val) if isinstance(d, (int, float)) and not isinstance(d, bool) else val
            except ValueError:
                ns[row["dest"]] = val
    return ns


def list_expr(v):
    """Megatron-LM's moe_freq_type: an int, or a Python list expression of [0]*n + [1]*m (evaluated here
    without eval: lists, *, + only)."""
    def ev(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.List):
            return [ev(x) for x in n.elts]
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Mult, ast.Add)):
            x, y = ev(n.left), ev(n.right)
            return x * y if isinstance(n.op, ast.Mult) else x + y
        raise ValueError(ast.dump(n))
    return v if v is None or isinstance(v, int) else ev(ast.parse(str(v), mode="eval").body)


def _transformer_config(ns):
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig
    E_ = int(ns["num_experts"]) if ns["num_experts"] else None
    return TransformerConfig(
        num_layers=int(ns["num_layers"]), hidden_size=int(ns["hidden_size"]),
        num_attention_heads=int(ns["num_attention_heads"]), ffn_hidden_size=int(ns["ffn_hidden_size"]),
        kv_channels=int(ns["kv_channels"]) if ns["kv_channels"] else None,
        num_query_groups=int(ns["num_query_groups"]) if ns["group_query_attention"] else None,
        normalization=ns["normalization"], layernorm_epsilon=float(ns["layernorm_epsilon"]),
        gated_linear_unit=ns["swiglu"], activation_func=F.silu if ns["swiglu"] else F.gelu,
        add_bias_linear=ns["add_bias_linear"], add_qkv_bias=ns["add_qkv_bias"], qk_layernorm=ns["qk_layernorm"],
        attention_dropout=float(ns["attention_dropout"]), hidden_dropout=float(ns["hidden_dropout"]),
        window_size=engine_validate._pair(ns["window_size"]), window_attn_skip_freq=list_expr(ns["window_attn_skip_freq"]),
        num_moe_experts=E_, moe_router_topk=int(ns["moe_router_topk"]),
        moe_ffn_hidden_size=int(ns["moe_ffn_hidden_size"]) if ns["moe_ffn_hidden_size"] else None,
        moe_shared_expert_intermediate_size=int(ns["moe_shared_expert_intermediate_size"])
        if ns["moe_shared_expert_intermediate_size"] else None,
        moe_shared_expert_gate=ns["moe_shared_expert_gate"], moe_router_pre_softmax=ns["moe_router_pre_softmax"],
        moe_layer_freq=list_expr(ns["moe_layer_freq"]), use_cpu_initialization=True)


def megatron_view(text):
    import torch.nn.functional as F
    from megatron.core.transformer.utils import is_layer_window_attention
    ns = namespace(text)
    tc = _transformer_config(ns)
    L = tc.num_layers
    mult = int(ns["make_vocab_size_divisible_by"]) * int(ns["tensor_model_parallel_size"])
    rope = ns["position_embedding_type"] == "rope"
    act = "silu" if tc.gated_linear_unit and tc.activation_func is F.silu else "gelu"
    v = dict(layers=tc.num_layers, hidden=tc.hidden_size, heads=tc.num_attention_heads, kv_heads=tc.num_query_groups,
             head_dim=tc.kv_channels, vocab=math.ceil(int(ns["vocab_size"]) / mult) * mult, norm=tc.normalization,
             norm_eps=tc.layernorm_epsilon, act=act if tc.gated_linear_unit else f"{act} (ungated)",
             rope_base=float(ns["rotary_base"]) if rope else None,
             rope_type="llama3" if ns["use_rope_scaling"] else "default",
             # gpt_builders.py (core_v0.16.1) passes rope_scaling=--use-rope-scaling and never the factor:
             # GPTModel's default 8 is what trains (tests/test_engines_field_walk checks the source says so)
             rope_factor=8.0 if ns["use_rope_scaling"] else None,
             rotary_percent=float(ns["rotary_percent"]) if rope else None,
             bias=tc.add_bias_linear, qkv_bias=tc.add_qkv_bias or tc.add_bias_linear, qk_norm=tc.qk_layernorm,
             qk_norm_per_head_weights=False, parallel_residual=False,
             tied=not ns["untie_embeddings_and_output_weights"], attention_dropout=tc.attention_dropout,
             hidden_dropout=tc.hidden_dropout, embedding_dropout=tc.hidden_dropout,    # (the embedding's too)
             router_jitter=0.0, ffn=tc.ffn_hidden_size,
             window=[is_layer_window_attention(tc.window_size, tc.window_attn_skip_freq, i + 1) for i in range(L)],
             window_size=tc.window_size[0] + 1 if tc.window_size else None)
    # Megatron-Core's _apply_scaling fixes these at Llama 3's values
    v["rope_fixed"] = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192} \
        if v["rope_factor"] is not None else None
    if tc.num_moe_experts:
        freq = tc.moe_layer_freq
        moe = [bool(freq[i]) for i in range(L)] if isinstance(freq, list) else [i % freq == 0 for i in range(L)]
        v.update(experts=tc.num_moe_experts, top_k=tc.moe_router_topk, expert_ffn=tc.moe_ffn_hidden_size, moe=moe,
                 shared_ffn=tc.moe_shared_expert_intermediate_size or 0, shared_gate=tc.moe_shared_expert_gate,
                 pre_softmax=tc.moe_router_pre_softmax)
    return v


# ---- torchtitan: the flavor the file names, as torchtitan's own source defines it ------------------------
def torchtitan_flavors():
    """{flavor: view} of torchtitan 0.2.2's llama3_args (its models/llama3/__init__.py, read with ast; the
    arguments built by its own TransformerModelArgs; the FFN width by its FeedForward rule)."""
    import importlib.util
    engine_validate._torchtitan_package()
    root = sys.modules["torchtitan"].__path__[0]
    spec = importlib.util.spec_from_file_location("_tt_args", os.path.join(root, "models/llama3/model/args.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    tree = ast.parse(open(os.path.join(root, "models/llama3/__init__.py")).read())
    table = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "llama3_args")
    out = {}
    for k, call in zip(table.keys, table.values):
        a = m.TransformerModelArgs(**{kw.arg: ast.literal_eval(kw.value) for kw in call.keywords})
        f = int(2 * 4 * a.dim / 3)
        f = int(a.ffn_dim_multiplier * f) if a.ffn_dim_multiplier is not None else f
        rs = a.rope_scaling_args
        out[k.value] = dict(layers=a.n_layers, hidden=a.dim, heads=a.n_heads, kv_heads=a.n_kv_heads or a.n_heads,
                            head_dim=a.dim // a.n_heads, vocab=a.vocab_size, norm="RMSNorm", norm_eps=a.norm_eps,
                            act="silu", rope_base=float(a.rope_theta), rope_type="llama3",
                            rope_factor=float(rs.scaling_factor), bias=False, qkv_bias=False, tied=False,
                            attention_dropout=0.0, router_jitter=0.0, rotary_percent=1.0, qk_norm=False,
                            qk_norm_per_head_weights=False, parallel_residual=False, hidden_dropout=0.0,
                            embedding_dropout=0.0,
                            rope_fixed={"low_freq_factor": rs.low_freq_factor, "high_freq_factor": rs.high_freq_factor,
                                        "original_max_position_embeddings": rs.original_max_position_embeddings},
                            ffn=a.multiple_of * ((f + a.multiple_of - 1) // a.multiple_of),
                            window=[False] * a.n_layers, window_size=None)
    return out
