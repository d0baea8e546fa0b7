"""FP8 linear layers through the engines' files (sapp/engines/fp8.py): Megatron-LM's --fp8-format /
--fp8-recipe delayed or blockwise and torchtitan 0.2.2's float8 converter are exported, read back at the
same price and accepted by the engines' own parsers; what sapp does not price (other recipes, mxfp8, FP8
all-gathers, torchtitan 0.3's rowwise-only converter, DeepSpeed, a blockwise plan into torchtitan) is
refused in one line."""
import os
import re

import pytest

import sapp.engines as E
from sapp import api
from sapp.commands.cli import main
from sapp.engines import fp8 as F
from sapp.engines import megatron, torchtitan
from sapp.engines.mapping import EngineError
from sapp.errors import SappError

from tests import engine_validate as V

H100 = "h100-80g"
RUNTIME = {"megatron": "fused", "torchtitan@0.2.2": "torchtitan-0.2.2"}
MIRROR = "/work/.mirror/NVIDIA+Megatron-LM/repo"


@pytest.fixture(scope="module")
def g8():
    return api.capture_graph(api.resolve_model("llama3-8b")[0])[0]


def _exported(g8, engine, recipe):
    cl = api.resolve_cluster(H100)
    plan = api.search("llama3-8b", cl, graph=g8, global_batch=16, constraints={"target": engine},
                      runtime=RUNTIME[engine], fp8=recipe)
    text, out, notes = E.export_plan(plan, engine, graph=g8, cluster=cl)
    return text, out, cl


@pytest.mark.parametrize("engine,recipe", [("megatron", "delayed"), ("megatron", "blockwise"),
                                           ("torchtitan@0.2.2", "tensorwise")])
def test_an_fp8_plan_exports_and_reads_back_at_the_same_price(g8, engine, recipe):
    text, out, cl = _exported(g8, engine, recipe)
    assert out["settings"]["fp8"] == recipe
    if engine == "megatron":     # blockwise in e4m3, Float8BlockScaling's default and DeepSeek-V3's format
        assert f"--fp8-format {F.MEGATRON_FORMAT[recipe]}\n--fp8-recipe {recipe}" in text
    else:
        assert 'converters = ["quantize.linear.float8"]' in text and 'filter_fqns = ["output"]' in text
    back = E.import_config(text, engine, g8, cl, "llama3-8b")
    assert back["settings"]["fp8"] == recipe
    assert back["predicted"]["step_time_s"] == out["predicted"]["step_time_s"]
    assert back["predicted"]["peak_memory_bytes"] == out["predicted"]["peak_memory_bytes"]


def test_the_other_recipe_is_exported_as_the_engines_own_and_repriced(g8):
    cl = api.resolve_cluster(H100)
    plan = api.search("llama3-8b", cl, graph=g8, global_batch=16, constraints={"target": "megatron"},
                      runtime="fused", fp8="tensorwise")
    text, out, notes = E.export_plan(plan, "megatron", graph=g8, cluster=cl)
    assert out["settings"]["fp8"] == "delayed" and any("runs delayed" in n for n in notes)
    assert "--fp8-recipe delayed" in text


ARGS = """--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
--group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192
--vocab-size 128256 --normalization RMSNorm --swiglu --position-embedding-type rope --rotary-base 500000
--disable-bias-linear --untie-embeddings-and-output-weights --attention-dropout 0.0 --hidden-dropout 0.0
--tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce
--overlap-param-gather --micro-batch-size 1 --global-batch-size 32 --bf16 --grad-reduce-in-bf16
"""


def test_a_megatron_fp8_file_is_priced_fp8_whichever_format(g8):
    cl = api.resolve_cluster(H100)
    bf16 = E.import_config(ARGS, "megatron", g8, cl, "llama3-8b")
    hybrid = E.import_config(ARGS + "--fp8-format hybrid\n", "megatron", g8, cl, "llama3-8b")
    e4m3 = E.import_config(ARGS + "--fp8-format e4m3 --fp8-recipe delayed --fp8-amax-history-len 1024\n",
                           "megatron", g8, cl, "llama3-8b")
    assert not bf16["settings"].get("fp8")
    assert hybrid["settings"]["fp8"] == e4m3["settings"]["fp8"] == "delayed"
    assert hybrid["predicted"]["step_time_s"] == e4m3["predicted"]["step_time_s"]
    assert hybrid["predicted"]["step_time_s"] < 0.9 * bf16["predicted"]["step_time_s"]
    with pytest.raises(SappError, match="no FP8 tensor cores"):
        E.import_config(ARGS + "--fp8-format hybrid\n", "megatron", g8, api.resolve_cluster("a100-80g"), "llama3-8b")
    # blockwise (TE's Float8BlockScaling) in either format: priced between delayed and bf16
    block = {f: E.import_config(ARGS + f"--fp8-format {f} --fp8-recipe blockwise\n", "megatron", g8, cl, "llama3-8b")
             for f in F.MEGATRON_FORMATS}
    assert {b["settings"]["fp8"] for b in block.values()} == {"blockwise"}
    assert block["e4m3"]["predicted"]["step_time_s"] == block["hybrid"]["predicted"]["step_time_s"]
    assert hybrid["predicted"]["step_time_s"] < block["e4m3"]["predicted"]["step_time_s"] < bf16["predicted"]["step_time_s"]


def _facts(g8):
    names = E.block_names(g8)
    return {**E.model_facts(g8.meta, names), **E.arch_facts("llama3-8b", g8.meta, len(names))}


@pytest.mark.parametrize("extra,says", [
    ("--fp8-format hybrid --fp8-recipe tensorwise", "--fp8-recipe tensorwise"),
    ("--fp8-format hybrid --fp8-recipe mxfp8", "--fp8-recipe mxfp8: mxfp8 (1x32 blocks with e8m0 scales) runs on Blackwell"),
    ("--fp8-format e4m3 --fp8-recipe custom", "--fp8-recipe custom"),
    ("--fp8-format e4m3 --fp8-recipe blockwise --no-fp8-wgrad", "--no-fp8-wgrad"),
    ("--fp8-format e5m2", "--fp8-format e5m2"),
    ("--fp8-format hybrid --fp8-param-gather", "--fp8-param-gather"),
    ("--fp8-format hybrid --no-fp8-wgrad", "--no-fp8-wgrad"),
    ("--fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16", "--fp8-recipe"),
    ("--fp8-format hybrid --fp8-recipe delayed --first-last-layers-bf16", "--first-last-layers-bf16"),
])
def test_megatron_fp8_settings_sapp_does_not_price_are_refused_in_one_line(g8, extra, says):
    with pytest.raises(EngineError) as e:
        megatron.parse(ARGS + extra + "\n", _facts(g8), 8)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(EngineError, match="add --bf16"):
        megatron.parse(ARGS.replace("--bf16 --grad-reduce-in-bf16", "") + "--fp8-format hybrid", _facts(g8), 8)


def _toml():
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "torchtitan_published")
    with open(os.path.join(here, "llama3_8b.toml")) as f:
        return f.read()


def _float8(text, converters='["quantize.linear.float8"]', **keys):
    """torchtitan 0.2.2's own llama3_8b job with the float8 converter on and [quantize.linear.float8] as given
    (filter_fqns = ["output"] unless said)."""
    text = text.replace('# converters = ["float8"]', f"converters = {converters}")
    keys = {"filter_fqns": '["output"]', **keys}
    body = "".join(f"{k} = {v}\n" for k, v in keys.items())
    return re.sub(r"\[quantize\.linear\.float8\]\n(?:[a-z0-9_]+ = .*\n)+", f"[quantize.linear.float8]\n{body}", text)


def test_torchtitans_own_job_reads_bf16_and_with_the_converter_tensorwise(g8):
    text = _toml()
    assert torchtitan.parse(text, _facts(g8), 64).fp8 == ""      # converter commented out: bf16
    assert torchtitan.parse(_float8(text), _facts(g8), 64).fp8 == "tensorwise"
    same = _float8(text, recipe_name='"tensorwise"', precompute_float8_dynamic_scale_for_fsdp="true")
    assert torchtitan.parse(same, _facts(g8), 64).fp8 == "tensorwise"


@pytest.mark.parametrize("converters,keys,says", [
    ('["float8"]', {}, "KeyError"),
    ('["quantize.linear.mx"]', {}, "'quantize.linear.mx'"),
    ('["quantize.linear.float8"]', {"recipe_name": '"rowwise"'}, "recipe_name = 'rowwise'"),
    ('["quantize.linear.float8"]', {"enable_fsdp_float8_all_gather": "true"}, "enable_fsdp_float8_all_gather"),
    ('["quantize.linear.float8"]', {"emulate": "true"}, "emulate"),
    ('["quantize.linear.float8"]', {"filter_fqns": "[]"}, "filter_fqns = []"),
])
def test_torchtitan_float8_settings_sapp_does_not_price_are_refused_in_one_line(g8, converters, keys, says):
    with pytest.raises(EngineError) as e:
        torchtitan.parse(_float8(_toml(), converters, **keys), _facts(g8), 64)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("engine,recipe,says", [("torchtitan", "tensorwise", "rowwise only"),
                                                ("deepspeed", "tensorwise", "no FP8 linear layers"),
                                                ("torchtitan@0.2.2", "blockwise", "no blockwise scaling")])
def test_engines_that_state_no_priced_fp8_refuse_the_export_in_one_line(engine, recipe, says):
    p = api.search("llama-tiny", H100, global_batch=8, fp8=recipe, constraints={"tp": 1, "pp": 1})
    with pytest.raises(EngineError) as e:
        E.export_plan(p, engine)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_torchtitan_022_has_no_blockwise_float8_linear():
    """The refusal's ground: 0.2.2's Float8Linear recipes are tensorwise / rowwise only (its job_config), and
    a blockwise target search is refused in one line."""
    pytest.importorskip("torchtitan")
    import typing
    from torchtitan.config.job_config import Float8Linear
    names = {a for t in typing.get_args(typing.get_type_hints(Float8Linear)["recipe_name"]) for a in typing.get_args(t)}
    assert names == {"tensorwise", "rowwise", "rowwise_with_gw_hp"}
    assert F.target_recipe("megatron", "blockwise") == "blockwise"
    with pytest.raises(EngineError) as e:
        F.target_recipe("torchtitan@0.2.2", "blockwise")
    assert "no blockwise scaling" in str(e.value) and "\n" not in str(e.value)


def test_search_targets_price_the_engines_recipe_or_refuse_in_one_line(capsys, tmp_path):
    out = tmp_path / "p.json"
    assert main(["search", "--model", "llama-tiny", "--cluster", H100, "--batch", "8", "--fp8", "delayed",
                 "--target", "megatron", "--out", str(out)]) == 0
    assert '"fp8": "delayed"' in out.read_text()
    for recipe, target, says in (("tensorwise", "megatron", "use --fp8 delayed"),
                                 ("delayed", "torchtitan@0.2.2", "use --fp8 tensorwise"),
                                 ("tensorwise", "torchtitan", "rowwise only"),
                                 ("tensorwise", "deepspeed", "no FP8 linear layers")):
        capsys.readouterr()
        assert main(["search", "--model", "llama-tiny", "--cluster", H100, "--fp8", recipe, "--target", target]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, err


# ---- the engines' own parsers ------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", ["delayed", "blockwise"])
def test_megatron_core_builds_the_fp8_export(g8, recipe):
    pytest.importorskip("megatron.core")
    text, _, _ = _exported(g8, "megatron", recipe)
    _, tc = V.megatron(text)
    assert (tc.fp8, tc.fp8_recipe) == (F.MEGATRON_FORMAT[recipe], recipe)


def test_torchtitan_022_reads_the_fp8_export_and_registers_its_converter_name(g8, tmp_path):
    pytest.importorskip("tyro")
    text, _, _ = _exported(g8, "torchtitan@0.2.2", "tensorwise")
    path = tmp_path / "job.toml"
    path.write_text(text)
    try:
        cfg = V.torchtitan(path)
    except ImportError:
        pytest.skip("torchtitan not installed")
    f8 = cfg.quantize.linear.float8
    assert cfg.model.converters == [F.TT_NAME] and f8.recipe_name is None and f8.filter_fqns == ["output"]
    assert not f8.enable_fsdp_float8_all_gather and not f8.emulate
    # the name the installed 0.2.2 registers (its package imports triton, absent here: read, not run)
    import sys
    src = os.path.join(list(sys.modules["torchtitan"].__path__)[0], "components", "quantization", "float8.py")
    with open(src) as f:
        assert f'register_model_converter(Float8LinearConverter, "{F.TT_NAME}")' in f.read()


@pytest.mark.skipif(not os.path.isdir(MIRROR), reason="needs the fetched Megatron-LM (bench/megatron_accepts.py)")
def test_megatron_lm_parse_args_accepts_the_fp8_export(g8, tmp_path):
    from bench.megatron_accepts import EXTRA, argv_of, environment_of, extract, run_megatron
    text, _, cl = _exported(g8, "megatron", "delayed")
    extract(MIRROR, "core_v0.16.1", str(tmp_path))
    res = run_megatron(str(tmp_path), argv_of(text) + EXTRA, cl.devices, 9, environment_of(text))
    assert res["accepted"], res.get("error")
    bad = run_megatron(str(tmp_path), argv_of(text.replace("recipe delayed", "recipe rowwise")) + EXTRA,
                       cl.devices, 9, environment_of(text))
    assert not bad["accepted"] and "fp8-recipe" in bad["error"]      # the flag is read, its values checked
