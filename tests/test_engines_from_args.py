"""`sapp import --from megatron FILE --cluster C` without --model prices the model the argument file
states (sapp/engines/megatron_build.py): Megatron-LM's published GPT-3 175B example (tied embeddings,
fused attention) fits on 128 A100 80 GB as the zoo's GPT-3 set to the same architecture does, byte for
byte; the exported plan states the same model again; Megatron-Core builds it with the parameters sapp
priced; what no zoo builder has is refused in one line naming the flag."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sapp import api
from sapp.commands.cli import main
from sapp.errors import SappError
from sapp.engines import EngineError, export_plan, import_config
from sapp.engines.megatron import tokens
from sapp.engines.megatron_build import build, config

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(HERE)
GPT3 = os.path.join(ROOT, "bench", "megatron_args", "example_gpt3_175b.args")
MIXTRAL = os.path.join(ROOT, "bench", "megatron_args", "example_mixtral_8x7b.args")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="module")
def gpt3_plan(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("fromargs") / "gpt3.json")
    rc = main(["import", "--from", "megatron", GPT3, "--cluster", "a100-80g:devices=128", "--no-compare", "--out", out])
    from sapp.plan import Plan
    return rc, Plan.load(out)


def test_gpt3_example_prices_the_model_it_states(gpt3_plan):
    rc, plan = gpt3_plan
    assert rc == 0                                     # fits: the command's exit status says so
    cl = api.resolve_cluster("a100-80g:devices=128")
    assert plan["predicted"]["peak_memory_bytes"] <= cl.usable_memory
    meta = plan["model"]["meta"]
    assert meta["kind"] == "gpt" and meta["config"]["tie_embeddings"] is True and meta["config"]["V"] == 51200
    assert not any("another model" in n for n in plan["notes"])
    # the zoo's GPT-3 set by hand to what the script builds prices the same step and peak
    import sapp.models as models
    module = models.get("gpt3-175b", tie_embeddings=True, attn="sdpa")
    graph, _ = api.capture_graph(module)
    ref = import_config(_read(GPT3), "megatron", graph, cl, "gpt3-175b", source=GPT3)
    assert graph.meta["params"] == meta["params"]
    for k in ("peak_memory_bytes", "step_time_s"):
        assert ref["predicted"][k] == plan["predicted"][k], k
    # without the file's model, the untied zoo GPT-3 does not fit (what --model gpt3-175b prices)
    untied = import_config(_read(GPT3), "megatron", api.capture_graph(models.get("gpt3-175b"))[0], cl, "gpt3-175b")
    assert untied["predicted"]["peak_memory_bytes"] > cl.usable_memory


def _model_flags(a):
    return {k: v for k, v in a.items() if k in (
        "--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--ffn-hidden-size", "--swiglu",
        "--normalization", "--position-embedding-type", "--disable-bias-linear",
        "--untie-embeddings-and-output-weights",
        "--group-query-attention", "--num-query-groups", "--num-experts", "--moe-router-topk", "--rotary-base",
        "--attention-dropout", "--hidden-dropout", "--moe-grouped-gemm", "--moe-token-dispatcher-type")}


@pytest.mark.parametrize("path,cluster", [(GPT3, "a100-80g:devices=128"), (MIXTRAL, "h100-80g:devices=64")])
def test_export_states_the_model_the_file_stated(path, cluster, gpt3_plan):
    text = _read(path)
    if path == GPT3:
        plan = gpt3_plan[1]
    else:
        module = build(text, path)
        plan = import_config(text, "megatron", api.capture_graph(module)[0], api.resolve_cluster(cluster), path)
    out, _, notes = export_plan(plan, "megatron")
    assert not notes
    orig, back = tokens(text), tokens(out)
    assert config(back) == config(orig)                # the same model, built again from the export
    mine = _model_flags(orig)
    theirs = _model_flags(back)
    for k, v in mine.items():
        assert str(theirs.get(k, False)) == str(v) or float(theirs[k]) == float(v), (k, v, theirs.get(k))
    # what the export adds is stated explicitly at Megatron's default or at what the file left to it
    assert config({**orig, **{k: v for k, v in theirs.items() if k not in mine}}) == config(orig)


def test_megatron_core_builds_the_args_built_gpt3(gpt3_plan):
    pytest.importorskip("megatron.core")
    plan = gpt3_plan[1]
    text, _, _ = export_plan(plan, "megatron")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, os.path.join(HERE, "megatron_params.py")], input=text, capture_output=True,
                       text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["total"] == pytest.approx(plan["model"]["meta"]["params"], rel=1e-3)


BASE = {"--num-layers": "2", "--hidden-size": "64", "--num-attention-heads": "4", "--seq-length": "32",
        "--vocab-size": "256"}
LLAMA = {**BASE, "--normalization": "RMSNorm", "--swiglu": True, "--position-embedding-type": "rope",
         "--disable-bias-linear": True, "--untie-embeddings-and-output-weights": True, "--attention-dropout": "0.0",
         "--hidden-dropout": "0.0", "--group-query-attention": True, "--num-query-groups": "2",
         "--ffn-hidden-size": "128"}


def test_styles_and_defaults():
    kind, c = config(BASE)
    assert kind == "gpt" and c["ffn"] == 256 and c["tie_embeddings"] and c["dropout"] == 0.1
    assert c["V"] == 256 and config({**BASE, "--vocab-size": "250", "--tensor-model-parallel-size": "2"})[1]["V"] == 256
    kind, c = config(LLAMA)
    assert kind == "llama" and c["kv"] == 2 and c["theta"] == 10000.0
    kind, c = config({**LLAMA, "--num-experts": "4", "--moe-ffn-hidden-size": "16",
                      "--moe-shared-expert-intermediate-size": "16", "--moe-layer-freq": "([0]*1+[1]*1)"})
    assert kind == "moe" and (c["experts"], c["top_k"], c["expert_ffn"], c["shared"], c["dense"]) == (4, 2, 16, 1, 1)
    no_vocab = {k: v for k, v in BASE.items() if k != "--vocab-size"}
    assert config({**no_vocab, "--tokenizer-type": "GPT2BPETokenizer"})[1]["V"] == 50304     # 50257 padded to 128


@pytest.mark.parametrize("flags", [BASE, {**BASE, "--untie-embeddings-and-output-weights": True}, LLAMA,
                                   {**LLAMA, "--num-experts": "4", "--moe-ffn-hidden-size": "16"}])
def test_the_built_module_has_the_parameters_an_engine_builds(flags):
    from sapp.engines.arch import architecture, count
    text = " ".join(k if v is True else f"{k} {v}" for k, v in flags.items())
    m = build(text, "m.args")
    n = sum(p.numel() for p in m.parameters())
    a = architecture("m.args", {"kind": m.sapp_spec.kind, "config": m.sapp_spec.config, "params": n}, 2)
    assert count(a) == n


@pytest.mark.parametrize("flags,named", [
    ({**BASE, "--swiglu": True}, "--normalization"),                 # SwiGLU beside LayerNorm: no builder
    ({**BASE, "--disable-bias-linear": True}, "--disable-bias-linear"),
    ({**BASE, "--group-query-attention": True, "--num-query-groups": "2"}, "--num-query-groups"),
    ({**BASE, "--attention-dropout": "0.0"}, "--attention-dropout"),
    ({**BASE, "--max-position-embeddings": "64"}, "--max-position-embeddings"),
    ({**LLAMA, "--add-qkv-bias": True}, "--add-qkv-bias"),
    ({**LLAMA, "--untie-embeddings-and-output-weights": False}, "--untie-embeddings-and-output-weights"),
    ({k: v for k, v in LLAMA.items() if k != "--hidden-dropout"}, "--hidden-dropout 0.1 (Megatron's default)"),
    ({**LLAMA, "--use-rope-scaling": True}, "--use-rope-scaling"),
    ({**LLAMA, "--num-experts": "4", "--moe-layer-freq": "([1]*2)"}, "--moe-layer-freq"),
    ({k: v for k, v in BASE.items() if k != "--vocab-size"}, "--vocab-size"),
    ({k: v for k, v in BASE.items() if k != "--seq-length"}, "--seq-length"),
    ({**BASE, "--hidden-size": "abc"}, "--hidden-size"),              # bad values: one line, no traceback
    ({**BASE, "--num-layers": "0"}, "--num-layers"),
    ({**BASE, "--num-layers": True}, "--num-layers needs a value"),
    ({**BASE, "--hidden-size": str(10 ** 9)}, "--hidden-size"),
    ({**BASE, "--hidden-dropout": "x"}, "--hidden-dropout"),
    ({**LLAMA, "--rotary-base": "nan"}, "--rotary-base"),
    ({**LLAMA, "--num-experts": "2", "--moe-router-topk": "3"}, "--moe-router-topk"),
])
def test_what_no_builder_has_is_refused_naming_the_flag(flags, named):
    flags = {k: v for k, v in flags.items() if v is not False}
    with pytest.raises(EngineError) as e:
        config(flags)
    assert named in str(e.value) and "\n" not in str(e.value)


def test_the_command_refuses_in_one_line(tmp_path, capsys):
    f = tmp_path / "m.args"
    f.write_text("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --vocab-size 256 "
                 "--qk-layernorm\n")
    assert main(["import", "--from", "megatron", str(f), "--cluster", "a100-80g:devices=8", "--no-compare"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--qk-layernorm" in err[0]
    # other engines' files do not state the whole model: --model is still needed
    t = tmp_path / "t.toml"
    t.write_text("[parallelism]\n")
    assert main(["import", "--from", "torchtitan", str(t), "--cluster", "a100-80g:devices=8"]) != 0
    assert "no model" in capsys.readouterr().err


def test_an_export_that_re_prices_builds_the_model_from_the_file(tmp_path):
    f = tmp_path / "tiny.args"
    f.write_text(" ".join(k if v is True else f"{k} {v}" for k, v in LLAMA.items()) + " --bf16\n")
    out = str(tmp_path / "p.json")
    assert main(["import", "--from", "megatron", str(f), "--cluster", "a100-80g:devices=2", "--no-compare",
                 "--out", out]) == 0
    from sapp.plan import Plan
    plan = Plan.load(out)
    assert plan["model"]["name"] == str(f)
    plan["settings"]["runtime"] = "eager"            # Megatron runs fused kernels: the export re-prices
    _, exported, notes = export_plan(plan, "megatron")
    assert any("re-priced as fused" in n for n in notes) and exported["settings"]["runtime"] == "fused"
    f.write_text(f.read_text().replace("--num-layers 2", "--num-layers 3"))
    with pytest.raises(SappError) as e:              # the file changed: not the model the plan priced
        export_plan(plan, "megatron")
    assert "\n" not in str(e.value)
