"""Pure bf16 training (torchtitan's training.dtype = "bfloat16": the model built in bf16, gradients and
AdamW's moments in bf16, no fp32 master weights), priced as the "adam-bf16" optimizer's 4 bytes a parameter
beside bf16 weights and gradients (8 a parameter, mixed precision's 16), imported from torchtitan 0.2.2's
TOML and 0.3's Python, exported back, parsed by torchtitan 0.2.2's ConfigManager; the other engines and
sapp run refuse such a plan in one line."""
from __future__ import annotations

import pytest

import sapp.engines as E
from sapp import api

from tests import engine_validate as V

MODEL, CLUSTER = "llama3-8b", "h100-80g:nodes=1"
TOML = ('[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\ndata_parallel_shard_degree = 8\n'
        'fsdp_reshard_after_forward = "always"\n[training]\nlocal_batch_size = 1\nglobal_batch_size = 8\n{dtype}'
        '[activation_checkpoint]\nmode = "full"\n')


@pytest.fixture(scope="module")
def graph():
    return api.capture_graph(api.resolve_model(MODEL)[0])[0]


def _import(graph, dtype, engine="torchtitan@0.2.2", text=None):
    text = text or TOML.format(dtype=f'dtype = "{dtype}"\n' if dtype else "")
    return E.import_config(text, engine, graph, api.resolve_cluster(CLUSTER), MODEL)


def _mem(plan):
    return plan["predicted"]["memory"]


def test_pure_bf16_holds_half_the_model_states_of_mixed_precision(graph):
    pure, mixed = _import(graph, "bfloat16"), _import(graph, None)
    assert pure["settings"]["optimizer"] == "adam-bf16" and mixed["settings"]["optimizer"] == "adam"
    assert _mem(pure)["optimizer"] == pytest.approx(_mem(mixed)["optimizer"] / 3, rel=1e-5)     # 4 of 12 bytes
    assert _mem(pure)["params"] == _mem(mixed)["params"] and _mem(pure)["grads"] == _mem(mixed)["grads"]
    assert pure["predicted"]["step_time_s"] <= mixed["predicted"]["step_time_s"]


@pytest.mark.parametrize("engine", ["torchtitan@0.2.2", "torchtitan"])
def test_pure_bf16_exports_back_at_the_same_price(graph, engine, tmp_path):
    cl = api.resolve_cluster(CLUSTER)
    plan = _import(graph, "bfloat16")
    text, exported, notes = E.export_plan(plan, engine, graph=graph, cluster=cl)
    assert ('dtype = "bfloat16"' if engine == "torchtitan@0.2.2" else "dtype='bfloat16',") in text
    again = E.import_config(text, engine, graph, cl, MODEL)
    assert again["settings"]["optimizer"] == "adam-bf16"
    assert again["predicted"]["step_time_s"] == pytest.approx(exported["predicted"]["step_time_s"], rel=1e-9)
    if engine == "torchtitan@0.2.2":
        cfg = V.torchtitan_text(text, tmp_path)
        assert cfg.training.dtype == "bfloat16" and cfg.training.mixed_precision_param == "bfloat16"


def test_other_engines_and_sapp_run_refuse_pure_bf16_and_bad_values_are_one_line(graph):
    plan = _import(graph, "bfloat16")
    for engine in ("megatron", "deepspeed"):
        with pytest.raises(E.EngineError, match="pure bf16"):
            E.export_plan(plan, engine, graph=graph)
    from sapp.emit.checks.plan import check_optimizer
    from sapp.errors import SappError
    with pytest.raises(SappError, match="training.dtype bfloat16"):
        check_optimizer(plan)
    with pytest.raises(E.EngineError, match="training.dtype 'float16'"):
        _import(graph, "float16")
    bad = TOML.format(dtype='dtype = "bfloat16"\nmixed_precision_param = "float32"\n')
    with pytest.raises(E.EngineError, match="mixed_precision_param"):
        _import(graph, None, text=bad)
