"""The model a Megatron export builds is the model sapp priced: Megatron-Core builds the GPT model of
the exported arguments (tests/megatron_params.py: real construction on the meta device, 1 and 2
layers, scaled to the layer count) and its parameter count (total, and active for MoE) equals the
captured model's within 0.1%: GPT-3 175B (untied), Llama-3-70B with context parallelism, a Llama-3-8B
Hugging Face config at 32K tokens and Mixtral-8x7B with expert parallelism 8."""
import json
import os
import subprocess
import sys

import pytest

import sapp.engines as E
from sapp import api
from sapp.engines.arch import count
from sapp.engines.megatron import ENV, tokens

HERE = os.path.dirname(__file__)
HF_8B = os.path.join(HERE, "data", "llama3-8b-32k.json")
CASES = {
    "gpt3-175b": ("gpt3-175b", "a100-80g:nodes=128", {}),
    "llama3-70b-cp2": ("llama3-70b", "h100-80g:nodes=16", {"cp": 2}),
    "llama3-8b-hf-32k": (HF_8B, "h100-80g:nodes=4", {}),
    "mixtral-8x7b-ep8": ("mixtral-8x7b", "h100-80g:nodes=16", {"ep": 8}),
}


def _export(case):
    model, cluster, pins = CASES[case]
    cl = api.resolve_cluster(cluster)
    graph, _ = api.capture_graph(api.resolve_model(model)[0])
    # as `sapp search --target megatron` finds it (engines.best_plan), then exported
    plan = E.best_plan(graph, cl, "megatron", global_batch=None, model=model, constraints=pins,
                       settings={"runtime": "fused"})
    text, exported, notes = E.export_plan(plan, "megatron", graph=graph, cluster=cl)
    assert not notes, notes                 # best_plan's plan is already what Megatron states
    return text, plan, graph


def _megatron_count(text):
    """Megatron-Core's count of one argument text, or a list of counts of a list of texts."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    stdin = json.dumps(text) if isinstance(text, list) else text
    r = subprocess.run([sys.executable, os.path.join(HERE, "megatron_params.py")], input=stdin, capture_output=True,
                       text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def exported():
    """{case: (text, plan, graph)}: the four exports, each searched once for the file's tests."""
    return {case: _export(case) for case in CASES}


@pytest.fixture(scope="module")
def counted(exported):
    """{case: Megatron-Core's count}, the four taken by one Megatron process."""
    pytest.importorskip("megatron.core")
    return dict(zip(CASES, _megatron_count([exported[c][0] for c in CASES])))


@pytest.mark.parametrize("case", list(CASES))
def test_megatron_builds_the_priced_model(exported, counted, case):
    (text, plan, graph), got = exported[case], counted[case]
    a = tokens(text)
    for flag in ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--seq-length",
                 "--max-position-embeddings", "--vocab-size"):
        assert flag in a, flag
    params = graph.meta["params"]
    assert got["total"] == pytest.approx(params, rel=1e-3), (got, params)
    arch = E.arch_facts(plan["model"]["name"], plan["model"]["meta"], int(a["--num-layers"]))["arch"]
    assert count(arch) == params
    if a.get("--num-experts"):
        assert a["--moe-token-dispatcher-type"] == "alltoall" and a["--moe-grouped-gemm"] is True
        assert got["active"] == pytest.approx(count(arch, active=True), rel=1e-3)
        assert got["active"] < 0.3 * got["total"]
    assert a["--grad-reduce-in-bf16"] is True and f"# {ENV}" in text
    print(f"{case}: megatron-core {got['total']:,} (active {got['active']:,}), sapp {params:,}")


def test_hf_export_states_the_config_sizes(exported):
    text = exported["llama3-8b-hf-32k"][0]
    a = tokens(text)
    assert (a["--hidden-size"], a["--num-query-groups"], a["--seq-length"], a["--rotary-base"]) == \
        ("4096", "8", "32768", "500000")
    assert a["--swiglu"] and a["--normalization"] == "RMSNorm" and a["--untie-embeddings-and-output-weights"]


def test_a_factory_model_is_refused_for_megatron(tmp_path):
    plan_meta = {"kind": "custom", "config": {}}
    assert E.arch_facts("pkg.mod:make", plan_meta, 2)["arch"] is None
    from sapp.engines import megatron
    from sapp.engines.mapping import EngineConfig
    with pytest.raises(E.EngineError, match="deepspeed"):
        megatron.export(EngineConfig(engine="megatron", global_batch=8), {"arch": None, "arch_why": None}, ["a", "b"])


@pytest.mark.slow      # about 18 s (a GPT-3 175B import): the four exports' builds above stay in the suite
def test_an_import_of_a_tied_dense_file_says_it_builds_another_model():
    text, plan, graph = _export("gpt3-175b")
    tied = "\n".join(ln for ln in text.splitlines() if ln not in ("--untie-embeddings-and-output-weights",
                                                                  "--grad-reduce-in-bf16"))
    cl = api.resolve_cluster(CASES["gpt3-175b"][1])
    back = E.import_config(tied, "megatron", graph, cl, "gpt3-175b")
    notes = " ".join(back._d.get("notes") or [])
    assert "another model" in notes and "--untie-embeddings-and-output-weights" in notes
    same = E.import_config(text, "megatron", graph, cl, "gpt3-175b")
    assert "another model" not in " ".join(same._d.get("notes") or [])
    # without --grad-reduce-in-bf16 Megatron keeps fp32 main_grads: priced so (twice the gradient bytes)
    assert back["settings"].get("grad_fp32") is True and "fp32-grads" in notes
    assert not same["settings"].get("grad_fp32")
    assert back["predicted"]["memory"]["grads"] == pytest.approx(2 * same["predicted"]["memory"]["grads"], rel=1e-5)
    assert "--grad-reduce-in-bf16" not in E.export_plan(back, "megatron", graph=graph, cluster=cl)[0]


@pytest.mark.parametrize("model,flavor", [("llama3-70b", "70B"), ("llama3-8b", "8B"), ("gpt3-175b", None)])
def test_torchtitan_export_names_its_flavor_or_says_loudly(model, flavor, tmp_path):
    import tomllib
    from sapp.engines import torchtitan
    meta = {"kind": api.resolve_model(model)[2]["kind"], "config": api.resolve_model(model)[2]["config"]}
    arch = E.arch_facts(model, meta, meta["config"]["l"])["arch"]
    from sapp.engines.mapping import EngineConfig
    text = torchtitan.export(EngineConfig(engine="torchtitan", global_batch=8, dp=8), {"arch": arch},
                             [f"layers.{i}" for i in range(meta["config"]["l"])])
    doc = tomllib.loads(text)
    if flavor:
        assert doc["model"] == {"name": "llama3", "flavor": flavor} and "NOTE" not in text
    else:
        assert "model" not in doc and "# NOTE: this model is none of torchtitan's llama3 flavors" in text
