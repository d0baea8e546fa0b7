"""Every field of the model reaches the engine, or the export refuses (issue 52): a sliding window, the
rope scaling factor, a torchtitan flavor, the plan's sequence parallelism; each checked with the
engine's own parser where the `engines` extra is installed."""
from __future__ import annotations

import pytest

import sapp.engines as E
from sapp.engines import EngineError, torchtitan
from sapp.models.registry import NAMED

from tests import engine_validate


def _facts(name):
    kind, cfg = NAMED[name]
    meta = {"kind": kind, "config": cfg, "seq": cfg["s"]}
    names = [f"layers.{i}" for i in range(cfg["l"])]
    return {**E.model_facts(meta, names), **E.arch_facts(name, meta, len(names))}


TOML_70B = """[model]
name = "llama3"
flavor = "70B"

[parallelism]
data_parallel_shard_degree = -1

[training]
local_batch_size = 1
seq_len = 8192
"""


def test_a_022_toml_of_another_flavor_than_the_model_is_refused_in_one_line(tmp_path):
    with pytest.raises(EngineError) as e:
        torchtitan.parse(TOML_70B, _facts("llama3-8b"), 64)
    msg = str(e.value)
    assert "flavor = '70B'" in msg and "8B" in msg and "\n" not in msg, msg
    # the same file of the model it names is read; a flavor sapp does not price is refused
    assert torchtitan.parse(TOML_70B, _facts("llama3-70b"), 64).dp == 64
    with pytest.raises(EngineError, match="debugmodel"):
        torchtitan.parse(TOML_70B.replace('"70B"', '"debugmodel"'), _facts("llama3-8b"), 64)
    # torchtitan 0.2.2's own ConfigManager reads the flavor the file states (what it would build)
    try:
        path = tmp_path / "job.toml"
        path.write_text(TOML_70B)
        cfg = engine_validate.torchtitan(str(path))
    except ImportError:
        return
    assert (cfg.model.name, cfg.model.flavor) == ("llama3", "70B")


def test_mixtral_tp2_ep4_exports_exactly_the_plans_sequence_parallelism():
    import warnings

    from sapp import api
    from sapp.engines.megatron import tokens
    module = api.resolve_model("mixtral-8x7b")[0]
    graph = api.capture_graph(module)[0]
    cl = api.resolve_cluster("h100-80g:nodes=8")
    plan = api.search("mixtral-8x7b", cl, graph=graph, global_batch=512, runtime="fused",
                      constraints={"target": "megatron", "tp": 2, "ep": 4})
    # Megatron-Core's MoE layer raises at tp > 1 without sequence parallelism: the plan is priced with it and says so
    assert plan["parallel"]["sp"] is True
    text, exported, notes = E.export_plan(plan, "megatron", graph=graph, cluster=cl)
    assert tokens(text).get("--sequence-parallel") is True
    assert notes == [] and exported is plan                 # nothing conformed: the file is the plan
    says = [n for n in plan["notes"] if "sequence" in n]
    assert len(says) == 1 and "without it" not in says[0], says
    back = E.import_config(text, "megatron", graph, cl, "mixtral-8x7b")
    assert back["parallel"]["sp"] is True
    assert back["predicted"]["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"], rel=1e-6)
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            mp, _ = engine_validate.megatron(text)
    except ImportError:
        return
    # core_v0.16.1's ModelParallelConfig warns "sequence parallelism must be used" without it
    assert not [w for w in said if "sequence parallelism must be used" in str(w.message)]
    assert mp.sequence_parallel is True and mp.expert_model_parallel_size == 4


def _hf_config(tmp_path, cls_name, **kw):
    """A shrunk config of transformers' own class, saved as transformers writes it (config.json)."""
    import transformers as T
    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024)
    cfg = getattr(T, cls_name)(**{**small, **kw})
    d = tmp_path / cls_name
    cfg.save_pretrained(d)
    return str(d / "config.json")


def _hf_arch(path, layers=4, seq=256):
    from sapp.engines.arch import architecture
    import json
    mt = json.load(open(path))["model_type"]
    return architecture(path, {"kind": "hf", "config": {"model_type": mt}, "seq": seq}, layers)


def _megatron_model(a):
    from sapp.engines.megatron import tokens
    from sapp.engines.megatron_model import model_args
    return "\n".join(model_args(a, 1)) + "\n", tokens("\n".join(model_args(a, 1)))


def test_mistral_sliding_window_reaches_megatron(tmp_path):
    # Mistral-7B's window (4096 tokens, the query's own included), shrunk: Megatron's (left, right) = (w - 1, 0)
    text, args = _megatron_model(_hf_arch(_hf_config(tmp_path, "MistralConfig", sliding_window=64)))
    assert args["--window-size"] == "63,0" and "--window-attn-skip-freq" not in args
    # Qwen2 with sliding attention on its upper layers only (max_window_layers): the pattern as Megatron's list
    q = _hf_arch(_hf_config(tmp_path, "Qwen2Config", use_sliding_window=True, sliding_window=64, max_window_layers=2))
    assert _megatron_model(q)[1]["--window-attn-skip-freq"] == "[0,0,1,1]"
    # Qwen2's default (use_sliding_window false): full attention, no window written
    assert "--window-size" not in _megatron_model(_hf_arch(_hf_config(tmp_path, "Qwen2Config")))[1]
    try:
        _, tc = engine_validate.megatron(text)
    except ImportError:
        return
    assert tc.window_size == (63, 0)                  # Megatron-Core's own TransformerConfig holds the window


def test_llama32_rope_scaling_factor_reaches_megatron_or_is_refused(tmp_path):
    rope = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
    a = _hf_arch(_hf_config(tmp_path, "LlamaConfig", max_position_embeddings=131072, rope_parameters=rope))
    # core_v0.16.1's gpt_builders.py never passes --rope-scaling-factor to GPTModel (default 8): refused
    with pytest.raises(EngineError) as e:
        _megatron_model(a)
    assert "rope_parameters.factor 32" in str(e.value) and "gpt_builders" in str(e.value), str(e.value)
    # Llama 3.1's factor 8 is what Megatron-Core builds: carried
    args = _megatron_model(_hf_arch(_hf_config(tmp_path / "8", "LlamaConfig", max_position_embeddings=131072,
                                               rope_parameters={**rope, "factor": 8.0})))[1]
    assert args["--use-rope-scaling"] is True and float(args["--rope-scaling-factor"]) == 8.0
    assert args["--rotary-base"] == "500000"
    # what Megatron-Core fixes (low / high frequency factors, the original context) is refused when it differs
    with pytest.raises(EngineError) as e:
        _hf_arch(_hf_config(tmp_path, "LlamaConfig", max_position_embeddings=131072,
                            rope_parameters={**rope, "high_freq_factor": 2.0}))
    assert "high_freq_factor" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(EngineError, match="rope_type 'yarn'"):
        _megatron_model(_hf_arch(_hf_config(tmp_path, "LlamaConfig", rope_parameters={
            "rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 256})))


DECODERS = ("LlamaConfig", "MistralConfig", "MixtralConfig", "Qwen2Config", "Qwen2MoeConfig")
# a value other than the shrunk default for each field that changes the computation
PROBES = {"num_hidden_layers": 6, "hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 4,
          "head_dim": 32, "intermediate_size": 256, "vocab_size": 1024, "max_position_embeddings": 2048,
          "rms_norm_eps": 3e-6, "tie_word_embeddings": None, "rope_parameters": {"rope_type": "default", "rope_theta": 123456.0},
          "sliding_window": 64, "use_sliding_window": True, "max_window_layers": 2,
          "layer_types": ["sliding_attention", "full_attention"] * 2, "attention_dropout": 0.1,
          "num_local_experts": 4, "num_experts_per_tok": 1, "hidden_act": "gelu", "attention_bias": True,
          "mlp_bias": True, "router_jitter_noise": 0.1,
          # Qwen2-MoE
          "num_experts": 4, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
          "decoder_sparse_step": 2, "mlp_only_layers": [0], "norm_topk_prob": True, "qkv_bias": False}
# what a probe needs beside it to mean anything (a window to use, a pattern over it)
# (Qwen2 attends within its window only with use_sliding_window, above max_window_layers)
WITH = {"sliding_window": {"use_sliding_window": True, "max_window_layers": 0},
        "use_sliding_window": {"sliding_window": 64, "max_window_layers": 0},
        "max_window_layers": {"use_sliding_window": True, "sliding_window": 64},
        "layer_types": {"sliding_window": 64, "use_sliding_window": True}}
# (Qwen2-MoE windows every other layer below max_window_layers, its default pattern the probe's: Qwen2's 0
# there is no window at all)
WITH_CLS = {"Qwen2MoeConfig": {"sliding_window": {"max_window_layers": 4}, "use_sliding_window": {"max_window_layers": 4},
                               "layer_types": {"max_window_layers": 0}}}


def _with(cls, k):
    return {**WITH.get(k, {}), **WITH_CLS.get(cls, {}).get(k, {})}


def _export_or_refusal(tmp_path, cls, **kw):
    import json
    path = _hf_config(tmp_path, cls, **kw)
    try:
        return _megatron_model(_hf_arch(path, layers=json.load(open(path))["num_hidden_layers"]))[0]
    except EngineError as e:
        assert "\n" not in str(e), str(e)
        return e


@pytest.mark.parametrize("cls", DECODERS)
def test_every_field_of_the_decoders_config_is_carried_or_refused(cls, tmp_path):
    import transformers as T
    from sapp.engines.arch_hf import FIELDS
    fields = set(getattr(T, cls)().to_dict())
    assert not sorted(fields - set(FIELDS)), "classify these fields in sapp/engines/arch_hf.FIELDS"
    base = _export_or_refusal(tmp_path, cls)
    assert not isinstance(base, EngineError), base
    dropped = []
    for k in sorted(fields & set(PROBES)):
        if FIELDS[k][0] == "irrelevant":
            continue
        kw = {**_with(cls, k), k: PROBES[k]}
        if k == "tie_word_embeddings":
            kw[k] = not getattr(T, cls)().tie_word_embeddings
        out = _export_or_refusal(tmp_path / k, cls, **kw)
        if not isinstance(out, EngineError):
            ref = _export_or_refusal(tmp_path / f"{k}-ref", cls, **_with(cls, k))
            if out == (base if k not in WITH else ref):
                dropped.append(k)              # the export is the same as without the field: silently dropped
    assert dropped == [], dropped


def test_torchtitan_names_no_llama3_flavor_for_another_attention():
    from sapp.engines import torchtitan_py
    a = _facts("llama3-8b")["arch"]
    assert torchtitan_py._flavor(a) == "8B" and torchtitan.model_section(a)[0] == {"name": "llama3", "flavor": "8B"}
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    assert torchtitan_py._flavor({**a, "rope_scaling": llama3}) == "8B"     # torchtitan's own rope scaling
    # a window, or Llama 3.2's factor 32, is not what torchtitan's llama3 computes: no flavor is written
    for other in ({"window": 4096}, {"rope_scaling": {**llama3, "factor": 32.0}}, {"norm_eps": 1e-6}):
        assert torchtitan_py._flavor({**a, **other}) is None and torchtitan.model_section({**a, **other})[0] is None


def test_a_windowed_export_round_trips_and_another_window_is_refused(tmp_path):
    from sapp import api
    path = _hf_config(tmp_path, "MistralConfig", sliding_window=256, hidden_size=256, intermediate_size=512,
                      num_attention_heads=8, num_key_value_heads=4, vocab_size=1024)
    cl = api.resolve_cluster("h100-80g:devices=8")
    plan = api.search(path, cl, global_batch=16, runtime="fused", constraints={"target": "megatron"})
    text, exported, notes = E.export_plan(plan, "megatron")
    assert "--window-size 255,0" in text.splitlines() and notes == []
    graph = api.capture_graph(api.resolve_model(path)[0])[0]
    back = E.import_config(text, "megatron", graph, cl, path, meta=plan["model"]["meta"])
    assert back["predicted"]["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"], rel=1e-9)
    for other in (text.replace("--window-size 255,0", "--window-size 4095,0"),
                  text.replace("--window-size 255,0\n", "")):
        with pytest.raises(EngineError) as e:
            E.import_config(other, "megatron", graph, cl, path, meta=plan["model"]["meta"])
        assert "--window-size" in str(e.value) and "\n" not in str(e.value), str(e.value)
