"""sapp's exports accepted by the engines' own code (the `engines` extra: megatron-core, torchtitan,
deepspeed; tests/engine_validate.py builds what each engine builds from the file).  Plans searched with
`--target <engine>` for GPT-3 175B on 128 x 8 A100 (fused runtime), Llama-3-405B at 8K tokens on
16,384 H100 and Mixtral-8x7B with expert parallelism on 128 H100 (DeepSpeed, data-parallel only: 175B
on 512 A100, 405B on 2,048 H200).  A test fails when an engine rejects the export."""
import json

import pytest

import sapp.engines as E
from sapp import api
from sapp.search.constraints import TARGETS

from tests import engine_validate as V

CASES = {
    # name: (model, cluster, global batch, runtime for megatron, pins)
    "gpt3-175b": ("gpt3-175b", "a100-80g:nodes=128", None, "fused", {}),
    "llama3-405b-8k": ("llama3-405b", "h100-80g:nodes=2048", 2048, "fused", {}),
    "mixtral-8x7b-ep": ("mixtral-8x7b", "h100-80g:nodes=16", None, "fused", {"ep": 8}),
}
# DeepSpeed's JSON states data parallelism only: a GPU per sample at most (175B: 512 A100), and 405B's
# whole 8K-token layers beside its ZeRO-3 shards need more than an H100 holds (99 GB priced): 2,048 H200
DEEPSPEED_CLUSTER = {"gpt3-175b": "a100-80g:nodes=64", "llama3-405b-8k": "h200:nodes=256"}
_graphs = {}


def _graph(model):
    if model not in _graphs:
        _graphs[model] = api.capture_graph(api.resolve_model(model)[0])[0]
    return _graphs[model]


def _export(case, engine):
    model, cluster, batch, runtime, pins = CASES[case]
    if engine == "deepspeed":
        cluster = DEEPSPEED_CLUSTER.get(case, cluster)
    if engine != "megatron":
        # no ep in a DeepSpeed JSON; torchtitan runs ep under FSDP2 only, sapp prices it under ZeRO-0/1
        # only: Mixtral searched without it there (the ep plan's export is refused below)
        pins = {k: v for k, v in pins.items() if k != "ep"}
    cl = api.resolve_cluster(cluster)
    graph = _graph(model)
    plan = api.search(model, cl, graph=graph, global_batch=batch, constraints={"target": engine, **pins},
                      runtime=runtime if engine == "megatron" else TARGETS[engine]["runtimes"][0])
    text, exported, notes = E.export_plan(plan, engine, graph=graph, cluster=cl)
    return text, exported


@pytest.mark.parametrize("case", list(CASES))
def test_megatron_core_accepts_the_export(case):
    pytest.importorskip("megatron.core")
    text, plan = _export(case, "megatron")
    mp, tc = V.megatron(text)
    par = plan["parallel"]
    assert (tc.tensor_model_parallel_size, tc.pipeline_model_parallel_size) == (par["tp"], par["pp"])
    assert tc.sequence_parallel == bool(par.get("sp")) and tc.expert_model_parallel_size == par.get("ep", 1)
    v = plan["pipeline"]["virtual_chunks"] if plan["pipeline"]["schedule"] == "interleaved" else None
    assert tc.virtual_pipeline_model_parallel_size == v
    if case == "mixtral-8x7b-ep":
        assert tc.num_moe_experts == 8 and par["ep"] == 8


@pytest.mark.parametrize("case", list(CASES))
def test_torchtitan_config_manager_accepts_the_export(case, tmp_path):
    pytest.importorskip("tyro")
    text, plan = _export(case, "torchtitan@0.2.2")
    path = tmp_path / "job.toml"
    path.write_text(text)
    try:
        cfg = V.torchtitan(path)
    except ImportError:
        pytest.skip("torchtitan not installed")
    par = plan["parallel"]
    assert cfg.parallelism.tensor_parallel_degree == par["tp"]
    assert cfg.parallelism.pipeline_parallel_degree == par["pp"]
    dp = cfg.parallelism.data_parallel_replicate_degree * cfg.parallelism.data_parallel_shard_degree
    assert dp == par["dp"] and cfg.training.global_batch_size == plan["model"]["global_batch"]
    assert cfg.parallelism.expert_parallel_degree == par.get("ep", 1)
    rep, shard = cfg.parallelism.data_parallel_replicate_degree, cfg.parallelism.data_parallel_shard_degree
    if rep > 1 and shard == 1:      # DDP only as the one parallelism
        assert par["tp"] == par["pp"] == par.get("cp", 1) == 1
    if rep > 1 and shard > 1:       # HSDP, which the search weighs for torchtitan (tests/test_engines_hsdp.py)
        assert par["dp_replicate"] == rep and plan["zero"] in (2, 3)


@pytest.mark.parametrize("case", list(CASES))
def test_deepspeed_config_parser_accepts_the_export(case):
    pytest.importorskip("deepspeed")
    text, plan = _export(case, "deepspeed")
    cfg = V.deepspeed(text, plan["parallel"]["dp"])
    assert cfg.zero_optimization_stage == plan["zero"]
    assert cfg.train_batch_size == plan["model"]["global_batch"]
    assert cfg.gradient_accumulation_steps == plan["pipeline"]["micro_batches"]
    assert json.loads(text)["train_micro_batch_size_per_gpu"] == plan["pipeline"]["micro_batch_size"]


def test_405b_does_not_fit_data_parallel_only_on_h100():
    from sapp.errors import InfeasibleError
    with pytest.raises(InfeasibleError):
        api.search("llama3-405b", "h100-80g:nodes=256", graph=_graph("llama3-405b"), global_batch=2048,
                   constraints={"target": "deepspeed"})


def test_deepspeed_and_torchtitan_refuse_the_expert_parallel_plan():
    model, cluster, batch, runtime, pins = CASES["mixtral-8x7b-ep"]
    cl = api.resolve_cluster(cluster)
    plan = api.search(model, cl, graph=_graph(model), constraints={"target": "megatron", **pins}, runtime="fused")
    with pytest.raises(E.EngineError, match="data parallelism only"):
        E.export_plan(plan, "deepspeed", graph=_graph(model), cluster=cl)
    if plan["zero"] == 1:
        with pytest.raises(E.EngineError, match="ZeRO-1"):
            E.export_plan(plan, "torchtitan", graph=_graph(model), cluster=cl)
