"""Every architecture field of the HF catalogue's decoders reaches each engine, or the export refuses
(issue 52, item 1's "done when"): transformers' own config classes, shrunk, each field set to a value
other than its default (tests/test_engines_arch.PROBES, MORE, EXTRA below: rope scaling types, partial
rotary), exported to Megatron, torchtitan 0.3, torchtitan 0.2.2 and DeepSpeed, and the export read back
by the engine's own code (tests/field_walk_views.py):

  Megatron      the flags read as Megatron-LM core_v0.16.1's parser reads them (its recorded argument
                table), then Megatron-Core's own TransformerConfig built from them (it validates), its
                is_layer_window_attention per layer, and what its pretrain_gpt builder passes to GPTModel
                (rope scaled by 8 whatever --rope-scaling-factor says: checked against its source);
  torchtitan    the flavor the file names (0.2.2: its ConfigManager; 0.3: sapp's ast reader) and that
                flavor's TransformerModelArgs from torchtitan's own source (the installed 0.2.2);
  DeepSpeed     DeepSpeedConfig accepts the file, which trains the user's HF module: the export names the
                config.json the script must build.

The decoders: CARRIED (the ten types sapp writes engine models of: Llama, Mistral, Mixtral, Qwen2,
Qwen2-MoE, Qwen3, Qwen3-MoE, StableLM, Phi-3, Starcoder2) field by field; REFUSED (Gemma 1-3, OLMo2,
OLMoE, DeepSeek-V2, GPT-NeoX, Falcon, Cohere, GraniteMoE) with each of item 1's fields they have
nudged, every export refused in one line naming the field Megatron-Core cannot state.  Each (config,
field) is carried (the engine's parsed model holds the HF value), refused (one line naming the field),
noted (torchtitan: no model written, the note naming the field), no effect, or dropped; the walk
asserts 0 dropped and prints its counts (`-s`)."""
from __future__ import annotations

import copy
import json
import os
import sys

import pytest

import sapp.engines as E
from sapp.engines import EngineError
from sapp.engines.mapping import EngineConfig

from tests import engine_validate
from tests.field_walk_views import hf_view as _hf_view, megatron_view as _megatron_view
from tests.field_walk_views import torchtitan_flavors as _torchtitan_flavors
from tests.test_engines_arch import DECODERS, PROBES, _hf_config, _with

HERE = os.path.dirname(__file__)
SEQ = 256
COUNTS = {}
# fields a torchtitan note states as the sizes it lists (layers, hidden, heads / kv, ffn, vocabulary)
SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size")


# ---- torchtitan: the flavor the file names ------------------------------------------------------------
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
    out = _export(engine, path, layers)
    if isinstance(out, EngineError):
        msg = str(out)
        assert "\n" not in msg, msg
        named = field is None or field in msg or (field == "use_sliding_window" and "sliding_window" in msg) \
            or "HF model type" in msg
        return ("refused", msg) if named else ("dropped", f"refused without naming {field}: {msg}")
    if engine == "deepspeed":
        # DeepSpeed's own parser accepts it; the module it trains is the one built from the config it names
        engine_validate.deepspeed(out, 8)
        named = path in json.loads(out).get("_comment", "")
        return ("carried", path) if named else ("dropped", "the config is not named")
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
    want = _hf_view(path)
    diff = sorted(k for k in want if k in got and got[k] != want[k])
    if diff:
        return "dropped", {k: (want[k], got[k]) for k in diff}
    return ("carried", "") if field is None or want != base_view else ("no effect", "")


# the catalogue's decoders sapp writes engine models of, each with what its shrunk default needs to be a
# valid model of the shrunk sizes (Phi-3's pad / eos ids inside the vocabulary; Starcoder2 with exact GELU,
# the one Megatron-Core's GPT builds: its default tanh GELU is probed below and refused)
CARRIED = {"LlamaConfig": {}, "MistralConfig": {}, "MixtralConfig": {}, "Qwen2Config": {}, "Qwen2MoeConfig": {},
           "Qwen3Config": {}, "Qwen3MoeConfig": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48},
           "StableLmConfig": {}, "Phi3Config": {"pad_token_id": None, "eos_token_id": 2},
           "Starcoder2Config": {"hidden_act": "gelu", "bos_token_id": 1, "eos_token_id": 2}}
# probes of the fields the five first decoders lack (a value other than the shrunk default)
MORE = {"qk_layernorm": True, "use_parallel_residual": True, "hidden_dropout": 0.1, "use_qkv_bias": True,
        "layer_norm_eps": 3e-6, "resid_pdrop": 0.1, "norm_epsilon": 3e-6, "use_bias": False, "residual_dropout": 0.1,
        "embedding_dropout": 0.1}
BY_CLASS = {"Starcoder2Config": {"hidden_act": "gelu_pytorch_tanh"}}
_ROPE = {"rope_theta": 10000.0}
# (field, what, the probe's settings) beside the one-field probes: rope scaling types and partial rotary
EXTRA = {
    "LlamaConfig": [("rope_parameters", f"rope {k}", {"rope_parameters": {**_ROPE, **r}}) for k, r in (
        ("linear", {"rope_type": "linear", "factor": 2.0}), ("dynamic", {"rope_type": "dynamic", "factor": 2.0}),
        ("yarn", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}),
        ("llama3 8", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192}),
        ("llama3 32", {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}),
        ("longrope", {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                      "original_max_position_embeddings": 256}),
        # (transformers 5 applies a partial_rotary_factor of any model's rope_parameters)
        ("partial rotary 0.5", {"rope_type": "default", "partial_rotary_factor": 0.5}))],
    "StableLmConfig": [("rope_parameters", "partial rotary 0.5", {"rope_parameters": {
        **_ROPE, "rope_type": "default", "partial_rotary_factor": 0.5}})],
    "Phi3Config": [("rope_parameters", "partial rotary 0.5", {"rope_parameters": {
        **_ROPE, "rope_type": "default", "partial_rotary_factor": 0.5}})],
    "Starcoder2Config": [("residual_dropout", "one dropout 0.1", {"residual_dropout": 0.1, "embedding_dropout": 0.1})],
}


def _probes(cls, base_kw):
    """[(field, label, settings, reference settings)] of class `cls` over its shrunk base `base_kw`."""
    import transformers as T
    from sapp.engines.arch_hf import FIELDS
    default = getattr(T, cls)()
    out = []
    for k in sorted(set(default.to_dict()) & (set(PROBES) | set(MORE))):
        if FIELDS[k][0] == "irrelevant":
            continue
        v = BY_CLASS.get(cls, {}).get(k, MORE.get(k, PROBES.get(k)))
        if k == "tie_word_embeddings":
            v = not default.tie_word_embeddings
        if k == "layer_types":
            v = (PROBES[k] * 2)[:4]
        ref = {**base_kw, **_with(cls, k)}
        out.append((k, k, {**ref, k: v}, ref))
    out += [(k, label, {**base_kw, **kw}, base_kw) for k, label, kw in EXTRA.get(cls, ())]
    return out


def _walk(engine, tmp_path, classes=DECODERS, sizes=None):
    """{(class, probe): outcome} over every probed field of each class (a tuple of classes: shrunk defaults;
    a dict: each class's base settings)."""
    flavors = _torchtitan_flavors() if engine.startswith("torchtitan") else None
    res = {}
    for cls in classes:
        base_kw = {**(classes.get(cls) or {} if isinstance(classes, dict) else {}), **(sizes or {})}
        base = _hf_config(tmp_path / "base", cls, **copy.deepcopy(base_kw))
        layers = json.load(open(base))["num_hidden_layers"]
        res[(cls, None)] = _outcome(engine, base, layers, None, None, tmp_path, flavors)
        for n, (k, label, kw, ref_kw) in enumerate(_probes(cls, base_kw)):
            path = _hf_config(tmp_path / f"p{n}", cls, **copy.deepcopy(kw))
            # (DeepSpeed trains the module the named config builds: no view to compare)
            ref = None if engine == "deepspeed" else _hf_view(_hf_config(tmp_path / f"p{n}-ref", cls,
                                                                         **copy.deepcopy(ref_kw)))
            res[(cls, label)] = _outcome(engine, path, json.load(open(path))["num_hidden_layers"], k, ref, tmp_path,
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
    res = _walk(engine, tmp_path, CARRIED if engine == "megatron" else {**CARRIED, **dict.fromkeys(REFUSED)})
    assert _report(engine, res) == {}
    assert res[("LlamaConfig", "rms_norm_eps")][0] == "carried"      # (the walk sees what it walks)
    if engine == "megatron":
        assert res[("MistralConfig", "sliding_window")][0] == "carried"
        assert res[("LlamaConfig", "hidden_act")][0] == "refused"
        assert res[("Qwen3Config", None)][0] == res[("Phi3Config", "partial rotary 0.5")][0] == "carried"
        assert res[("LlamaConfig", "rope partial rotary 0.5")][0] == "carried"
        for key, outcome in ((("Qwen3MoeConfig", None), "carried"), (("StableLmConfig", "use_qkv_bias"), "carried"),
                             (("StableLmConfig", "layer_norm_eps"), "carried"),
                             (("StableLmConfig", "qk_layernorm"), "refused"),
                             (("StableLmConfig", "use_parallel_residual"), "refused"),
                             (("Starcoder2Config", "use_bias"), "carried"), (("Starcoder2Config", "hidden_act"), "refused"),
                             (("Starcoder2Config", "one dropout 0.1"), "carried"),
                             (("LlamaConfig", "rope llama3 8"), "carried"), (("LlamaConfig", "rope llama3 32"), "refused")):
            assert res[key][0] == outcome, (key, res[key])
        for kind in ("linear", "dynamic", "yarn", "longrope"):
            assert res[("LlamaConfig", f"rope {kind}")][0] == "refused"
    else:
        assert res[("Gemma2Config", None)][0] == res[("DeepseekV2Config", None)][0] == "carried"


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
    # the catalogue's other decoders at those sizes: no flavor, the note naming what torchtitan's llama3 lacks
    # (a copy: StableLM's config class writes its partial_rotary_factor into the rope dict it is given)
    rope = {"rope_parameters": dict(LLAMA31_8B["rope_parameters"])}
    for cls, kw, why in (("Qwen3Config", {}, "q_norm / k_norm"), ("Qwen3MoeConfig", {}, "8 experts"),
                         ("StableLmConfig", rope, "norm LayerNorm"), ("Starcoder2Config", rope, "norm LayerNorm"),
                         ("Gemma2Config", {}, "attn_logit_softcapping")):
        path = _hf_config(tmp_path / cls, cls, **copy.deepcopy({**(CARRIED.get(cls) or {}), **LLAMA31_8B, **kw}))
        got = _outcome(engine, path, 32, None, None, tmp_path, _torchtitan_flavors())
        assert got[0] == "noted" and why in got[1], (cls, got)


MIRROR = "/work/.mirror/NVIDIA+Megatron-LM/repo"


@pytest.mark.skipif(not os.path.isdir(MIRROR), reason="needs the fetched Megatron-LM (bench/megatron_accepts.py)")
def test_megatron_lms_gpt_builder_passes_no_rope_scaling_factor():
    # what megatron_view (and the export's refusal of a factor other than 8) relies on: core_v0.16.1's
    # pretrain_gpt builds GPTModel with rope_scaling but not rope_scaling_factor, whose default is 8
    import subprocess
    src = subprocess.run(["git", "--git-dir", MIRROR, "show", "core_v0.16.1:gpt_builders.py"], capture_output=True,
                         text=True, check=True).stdout
    gpt = subprocess.run(["git", "--git-dir", MIRROR, "show", "core_v0.16.1:megatron/core/models/gpt/gpt_model.py"],
                         capture_output=True, text=True, check=True).stdout
    assert "rope_scaling=args.use_rope_scaling" in src and "rope_scaling_factor" not in src
    assert "rope_scaling_factor: float = 8.0" in gpt


# the catalogue's other decoders, each with a field (or module) Megatron-Core's GPT cannot state, which the
# refusal must name (sapp/engines/arch_hf.UNSTATED)
REFUSED = {"GemmaConfig": "hidden_act", "Gemma2Config": "attn_logit_softcapping",
           "Gemma3TextConfig": "attn_logit_softcapping", "Olmo2Config": "q_norm", "OlmoeConfig": "q_norm",
           "DeepseekV2Config": "kv_lora_rank",
           "GPTNeoXConfig": "use_parallel_residual", "FalconConfig": "parallel_attn", "CohereConfig": "logit_scale",
           "GraniteMoeConfig": "embedding_multiplier"}
# item 1's fields as those classes name them (attention window, rope, qk-norm, softcapping, biases, norm,
# activation, tying, MoE routing, dense-vs-expert FFN sizes, MLA dimensions)
ITEM1 = ("sliding_window layer_types rope_parameters rms_norm_eps layer_norm_eps layer_norm_epsilon hidden_act "
         "hidden_activation attention_bias mlp_bias use_bias bias use_qkv_bias qk_layernorm use_qk_norm "
         "tie_word_embeddings num_experts_per_tok n_shared_experts norm_topk_prob routed_scaling_factor n_group "
         "topk_group moe_intermediate_size intermediate_size first_k_dense_replace kv_lora_rank q_lora_rank "
         "qk_rope_head_dim qk_nope_head_dim v_head_dim attn_logit_softcapping final_logit_softcapping "
         "query_pre_attn_scalar use_parallel_residual parallel_attn alibi new_decoder_architecture logit_scale "
         "embedding_multiplier residual_multiplier attention_multiplier logits_scaling rotary_pct").split()


def _nudged(v):
    """A value other than `v` of its type (None where the walk has none to give)."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return 2 * v or 2
    if isinstance(v, float):
        return 2 * v or 0.1
    if isinstance(v, dict) and "rope_theta" in v:
        return {**v, "rope_theta": 2 * v["rope_theta"]}
    if isinstance(v, str) and v in ("gelu", "gelu_pytorch_tanh", "silu"):
        return "relu"
    return None


@pytest.mark.parametrize("cls", sorted(REFUSED))
def test_a_decoder_megatron_cannot_build_is_refused_naming_the_field(cls, tmp_path):
    import transformers as T
    d = getattr(T, cls)().to_dict()
    probes = [(k, _nudged(d[k])) for k in ITEM1 if k in d and _nudged(d[k]) is not None]
    assert probes
    res = {}
    for k, v in [(None, None)] + probes:
        try:
            path = _hf_config(tmp_path / str(k), cls, **({k: v} if k else {}))
        except (ValueError, TypeError) as e:        # the config class itself rejects the nudged value
            res[k] = ("rejected by transformers", str(e)[:80])
            continue
        out = _export("megatron", path, json.load(open(path))["num_hidden_layers"])
        assert isinstance(out, EngineError), (cls, k)
        msg = str(out)
        assert "\n" not in msg and REFUSED[cls] in msg and "HF model type" in msg, msg
        res[k] = ("refused", msg)
    COUNTS.setdefault("megatron, refused types", {}).setdefault(cls, len(res))
    print(f"\n{cls}: {sum(o == 'refused' for o, _ in res.values())} of {len(res)} refused naming {REFUSED[cls]}")
    if REFUSED[cls] not in ("q_norm",):         # (a module of the model, not a field of its config)
        assert REFUSED[cls] in d
