"""Every architecture field of the HF catalogue's decoders reaches each engine, or the export refuses
(issue 52, item 1's "done when"): transformers' own config classes, shrunk, each field set to a value
other than its default (tests/test_engines_arch.PROBES), exported to Megatron, torchtitan 0.3,
torchtitan 0.2.2 and DeepSpeed, and the export read back by the engine's own parser:

  Megatron      the flags read as Megatron-LM core_v0.16.1's parser reads them (its recorded argument
                table, tests/data/megatron_core_v0.16.1_args.json: dest, default, store_true/false), then
                Megatron-Core's own TransformerConfig built from them (it validates) and its
                is_layer_window_attention per layer;
  torchtitan    the flavor the file names (0.2.2: its ConfigManager; 0.3: sapp's ast reader) and that
                flavor's TransformerModelArgs from torchtitan's own source (the installed 0.2.2);
  DeepSpeed     DeepSpeedConfig accepts the file, which trains the user's HF module: the export names the
                config.json the script must build, and that file holds the field.

Each (config, field) is carried (the engine's parsed model holds the HF value), refused (one line
naming the field, or the model type for a decoder sapp writes no engine model of), or dropped; the
walk asserts 0 dropped and its counts are printed (`-s`).  The walk reads each config.json as export_plan
does (sapp/engines/arch.py), without capturing each probe; the other causal-LM types of the catalogue are
refused by model type (not walked here)."""
from __future__ import annotations

import ast
import json
import math
import os
import sys

import pytest

import sapp.engines as E
from sapp.engines import EngineError
from sapp.engines.mapping import EngineConfig

from tests import engine_validate
from tests.test_engines_arch import DECODERS, PROBES, _hf_config, _with

HERE = os.path.dirname(__file__)
ARGS = json.load(open(os.path.join(HERE, "data", "megatron_core_v0.16.1_args.json")))
SEQ = 256
COUNTS = {}
# fields a torchtitan note states as the sizes it lists (layers, hidden, heads / kv, ffn, vocabulary)
SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size")


# ---- the HF model as transformers builds it: what every engine must compute ------------------------------
def _hf_view(path):
    """The architecture transformers builds from `path`, keyed as the engines' views are."""
    from sapp.models.hf import load_config
    c = load_config(path, {})
    mt, g = c.model_type, (lambda k, d=None: getattr(c, k, d))
    L, h, a = c.num_hidden_layers, c.hidden_size, c.num_attention_heads
    rp = g("rope_parameters") or {}
    kind = rp.get("rope_type", "default")
    v = dict(layers=L, hidden=h, heads=a, kv_heads=g("num_key_value_heads") or a, head_dim=g("head_dim") or h // a,
             vocab=c.vocab_size, norm="RMSNorm", norm_eps=c.rms_norm_eps, act=c.hidden_act,
             rope_base=float(rp.get("rope_theta", 10000.0)), rope_type=kind,
             rope_factor=float(rp["factor"]) if kind != "default" else None,
             rope_fixed={k: rp.get(k) for k in ("low_freq_factor", "high_freq_factor",
                                                "original_max_position_embeddings")} if kind != "default" else None,
             bias=bool(g("attention_bias") or g("mlp_bias")), tied=bool(c.tie_word_embeddings),
             attention_dropout=float(g("attention_dropout", 0.0) or 0.0), router_jitter=g("router_jitter_noise", 0.0))
    v["qkv_bias"] = mt == "qwen2" or bool(g("qkv_bias")) or bool(g("attention_bias"))
    w, types = g("sliding_window"), g("layer_types")
    on = w and g("use_sliding_window") is not False
    v["window"] = [bool(on and (t == "sliding_attention" if types else True)) for t, _ in
                   zip(types or [None] * L, range(L))]
    v["window_size"] = w if any(v["window"]) else None
    v["ffn"] = c.intermediate_size
    if mt == "mixtral":
        v.update(experts=c.num_local_experts, top_k=c.num_experts_per_tok, expert_ffn=c.intermediate_size,
                 moe=[True] * L, shared_ffn=0, shared_gate=False, pre_softmax=False)
    elif mt == "qwen2_moe":
        moe = [i not in set(c.mlp_only_layers or ()) and (i + 1) % c.decoder_sparse_step == 0 for i in range(L)]
        v.update(experts=c.num_experts, top_k=c.num_experts_per_tok, expert_ffn=c.moe_intermediate_size, moe=moe,
                 shared_ffn=c.shared_expert_intermediate_size, shared_gate=True, pre_softmax=not c.norm_topk_prob)
    return v


# ---- Megatron: the flags as Megatron-LM's parser reads them, into Megatron-Core's config ----------------
def _namespace(text):
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


def _list_expr(v):
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


def _megatron_view(text):
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.utils import is_layer_window_attention
    ns = _namespace(text)
    win = engine_validate._pair(ns["window_size"])
    skip = _list_expr(ns["window_attn_skip_freq"])
    E_ = int(ns["num_experts"]) if ns["num_experts"] else None
    L = int(ns["num_layers"])
    tc = TransformerConfig(
        num_layers=L, hidden_size=int(ns["hidden_size"]), num_attention_heads=int(ns["num_attention_heads"]),
        ffn_hidden_size=int(ns["ffn_hidden_size"]), kv_channels=int(ns["kv_channels"]) if ns["kv_channels"] else None,
        num_query_groups=int(ns["num_query_groups"]) if ns["group_query_attention"] else None,
        normalization=ns["normalization"], layernorm_epsilon=float(ns["layernorm_epsilon"]),
        gated_linear_unit=ns["swiglu"], activation_func=F.silu if ns["swiglu"] else F.gelu,
        add_bias_linear=ns["add_bias_linear"], add_qkv_bias=ns["add_qkv_bias"],
        attention_dropout=float(ns["attention_dropout"]), hidden_dropout=float(ns["hidden_dropout"]),
        window_size=win, window_attn_skip_freq=skip, num_moe_experts=E_,
        moe_router_topk=int(ns["moe_router_topk"]), moe_ffn_hidden_size=int(ns["moe_ffn_hidden_size"])
        if ns["moe_ffn_hidden_size"] else None,
        moe_shared_expert_intermediate_size=int(ns["moe_shared_expert_intermediate_size"])
        if ns["moe_shared_expert_intermediate_size"] else None,
        moe_shared_expert_gate=ns["moe_shared_expert_gate"], moe_router_pre_softmax=ns["moe_router_pre_softmax"],
        moe_layer_freq=_list_expr(ns["moe_layer_freq"]), use_cpu_initialization=True)
    mult = int(ns["make_vocab_size_divisible_by"]) * int(ns["tensor_model_parallel_size"])
    v = dict(layers=tc.num_layers, hidden=tc.hidden_size, heads=tc.num_attention_heads, kv_heads=tc.num_query_groups,
             head_dim=tc.kv_channels, vocab=math.ceil(int(ns["vocab_size"]) / mult) * mult, norm=tc.normalization,
             norm_eps=tc.layernorm_epsilon, act="silu" if tc.gated_linear_unit and tc.activation_func is F.silu
             else "gelu", rope_base=float(ns["rotary_base"]) if ns["position_embedding_type"] == "rope" else None,
             rope_type="llama3" if ns["use_rope_scaling"] else "default",
             rope_factor=float(ns["rope_scaling_factor"]) if ns["use_rope_scaling"] else None,
             bias=tc.add_bias_linear, qkv_bias=tc.add_qkv_bias or tc.add_bias_linear,
             tied=not ns["untie_embeddings_and_output_weights"], attention_dropout=tc.attention_dropout,
             router_jitter=0.0, ffn=tc.ffn_hidden_size,
             window=[is_layer_window_attention(tc.window_size, tc.window_attn_skip_freq, i + 1) for i in range(L)],
             window_size=tc.window_size[0] + 1 if tc.window_size else None)
    if v["rope_factor"] is not None:     # Megatron-Core's _apply_scaling fixes these at Llama 3's values
        v["rope_fixed"] = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    else:
        v["rope_fixed"] = None
    if E_:
        freq = tc.moe_layer_freq
        moe = [bool(freq[i]) for i in range(L)] if isinstance(freq, list) else [i % freq == 0 for i in range(L)]
        v.update(experts=E_, top_k=tc.moe_router_topk, expert_ffn=tc.moe_ffn_hidden_size, moe=moe,
                 shared_ffn=tc.moe_shared_expert_intermediate_size or 0, shared_gate=tc.moe_shared_expert_gate,
                 pre_softmax=tc.moe_router_pre_softmax)
    return v


# ---- torchtitan: the flavor the file names, as torchtitan's own source defines it ------------------------
def _torchtitan_flavors():
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
                            attention_dropout=0.0, router_jitter=0.0,
                            rope_fixed={"low_freq_factor": rs.low_freq_factor, "high_freq_factor": rs.high_freq_factor,
                                        "original_max_position_embeddings": rs.original_max_position_embeddings},
                            ffn=a.multiple_of * ((f + a.multiple_of - 1) // a.multiple_of),
                            window=[False] * a.n_layers, window_size=None)
    return out


def _torchtitan_flavor(engine, text, tmp_path):
    """The flavor torchtitan builds from the file, or None where it names none."""
    if engine == "torchtitan@0.2.2":
        p = tmp_path / "job.toml"
        p.write_text(text)
        import tomllib
        if "model" not in tomllib.loads(text):
            return None                     # (ConfigManager's default: the 6-layer debugmodel)
        return engine_validate.torchtitan(str(p)).model.flavor
    from sapp.engines.pyconfig import Call, read
    root = read(text)[0]
    spec = root.kwargs.get("model_spec")
    return spec.args[0] if isinstance(spec, Call) else None


# ---- the walk ---------------------------------------------------------------------------------------
def _export(engine, path, layers):
    """The engine's file for the HF config at `path` (as export_plan writes it after conforming), or the
    EngineError of the export."""
    mt = json.load(open(path))["model_type"]
    meta = {"kind": "hf", "config": {"model_type": mt}, "seq": SEQ}
    names = [f"model.layers.{i}" for i in range(layers)]
    facts = E.model_facts(meta, names)
    if E.TABLE[engine].builds_model:
        facts.update(E.arch_facts(path, meta, layers))
    runtime = {"megatron": "fused", "deepspeed": "eager"}.get(engine, "torchtitan")
    ecfg = EngineConfig(engine=engine, global_batch=8, dp=8, runtime=runtime)
    header = [f"{engine} configuration written by `sapp export` for {path} on 8 GPUs"]
    try:
        return E.get(engine).export(ecfg, facts, names, header=header)
    except EngineError as e:
        return e


def _outcome(engine, path, layers, field, base_view, tmp_path, flavors):
    """("carried" | "refused" | "noted" | "no effect" | "dropped", detail)."""
    want = _hf_view(path)
    out = _export(engine, path, layers)
    if isinstance(out, EngineError):
        msg = str(out)
        assert "\n" not in msg, msg
        named = field is None or field in msg or (field == "use_sliding_window" and "sliding_window" in msg) \
            or "HF model type" in msg
        return ("refused", msg) if named else ("dropped", f"refused without naming {field}: {msg}")
    if engine == "deepspeed":
        engine_validate.deepspeed(out, 8)           # DeepSpeed's own parser accepts it
        named = path in json.loads(out).get("_comment", "")
        return ("carried", path) if named and _hf_view(path) == want else ("dropped", "the config is not named")
    if engine == "megatron":
        got = _megatron_view(out)
    else:
        flavor = _torchtitan_flavor(engine, out, tmp_path)
        if flavor is None:
            # no model written: the file says so, naming what differs (0.3 refuses it at launch)
            note = next((ln for ln in out.splitlines() if "none of torchtitan's llama3 flavors" in ln), "")
            named = field is None or field in note or field in SIZES or (field == "rope_parameters" and "rope" in note)
            return ("noted", note) if note and named else ("dropped", f"no flavor, and no note naming {field}: {note}")
        got = flavors[flavor]
    diff = sorted(k for k in want if k in got and got[k] != want[k])
    if diff:
        return "dropped", {k: (want[k], got[k]) for k in diff}
    return ("carried", "") if field is None or want != base_view else ("no effect", "")


def _walk(engine, tmp_path, classes=DECODERS, sizes=None):
    """{(class, field): outcome} over every probed field of each class."""
    import transformers as T
    from sapp.engines.arch_hf import FIELDS
    flavors = _torchtitan_flavors() if engine.startswith("torchtitan") else None
    res = {}
    for cls in classes:
        base_kw = dict(sizes or {})
        base = _hf_config(tmp_path / "base", cls, **base_kw)
        layers = json.load(open(base))["num_hidden_layers"]
        res[(cls, None)] = _outcome(engine, base, layers, None, None, tmp_path, flavors)
        base_view = _hf_view(base)
        for k in sorted(set(getattr(T, cls)().to_dict()) & set(PROBES)):
            if FIELDS[k][0] == "irrelevant":
                continue
            kw = {**base_kw, **_with(cls, k), k: PROBES[k]}
            if k == "tie_word_embeddings":
                kw[k] = not getattr(T, cls)().tie_word_embeddings
            if k == "layer_types":
                kw[k] = PROBES[k][:kw.get("num_hidden_layers", 4)] * 2
                kw[k] = kw[k][:kw.get("num_hidden_layers", 4)]
            path = _hf_config(tmp_path / k, cls, **kw)
            ref = _hf_view(_hf_config(tmp_path / f"{k}-ref", cls, **{**base_kw, **_with(cls, k)}))
            res[(cls, k)] = _outcome(engine, path, json.load(open(path))["num_hidden_layers"], k, ref, tmp_path,
                                     flavors)
    return res


def _report(engine, res):
    counts = {}
    for o, _ in res.values():
        counts[o] = counts.get(o, 0) + 1
    COUNTS[engine] = counts
    print(f"\n{engine}: {len(res)} (config, field) pairs: {counts}")
    return {k: d for k, (o, d) in res.items() if o == "dropped"}


@pytest.mark.parametrize("engine", ["megatron", "deepspeed"])
def test_every_field_of_the_shrunk_decoders_reaches_the_engine_or_is_refused(engine, tmp_path):
    if engine == "megatron":
        pytest.importorskip("megatron.core")
    else:
        pytest.importorskip("deepspeed")
    res = _walk(engine, tmp_path)
    assert _report(engine, res) == {}
    assert res[("LlamaConfig", "rms_norm_eps")][0] == "carried"      # (the walk sees what it walks)
    if engine == "megatron":
        assert res[("MistralConfig", "sliding_window")][0] == "carried"
        assert res[("LlamaConfig", "hidden_act")][0] == "refused"


# Llama 3.1 8B's sizes (rope: Llama 3's scaling, factor 8): torchtitan's llama3 flavor 8B, so that every
# field moved off it either keeps a flavor of that value or leaves the file naming no model, saying why
LLAMA31_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256, sliding_window=None, max_position_embeddings=131072, rms_norm_eps=1e-5,
                  rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
                                   "rope_theta": 500000.0})


@pytest.mark.parametrize("engine", ["torchtitan", "torchtitan@0.2.2"])
def test_every_field_off_a_torchtitan_flavor_is_carried_or_named(engine, tmp_path):
    import importlib.util
    if "torchtitan" not in sys.modules and importlib.util.find_spec("torchtitan") is None:      # (its __init__ imports triton: not imported here)
        pytest.skip("torchtitan is not installed (the engines extra)")
    res = _walk(engine, tmp_path, classes=("LlamaConfig", "MistralConfig"), sizes=LLAMA31_8B)
    assert _report(engine, res) == {}
    assert res[("LlamaConfig", None)][0] == "carried"
    noted = {k: d for k, (o, d) in res.items() if o == "noted"}
    assert "rope_theta" in noted[("LlamaConfig", "rope_parameters")], noted
    assert "sliding_window" in noted[("MistralConfig", "sliding_window")]
    # Llama 3 8B's own config states no rope scaling, which torchtitan's llama3 always applies (factor 8)
    plain = _hf_config(tmp_path / "plain", "LlamaConfig", **{**LLAMA31_8B, "rope_parameters": {
        "rope_type": "default", "rope_theta": 500000.0}})
    assert _outcome(engine, plain, 32, "rope_parameters", None, tmp_path, _torchtitan_flavors())[0] == "noted"
