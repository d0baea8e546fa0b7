"""`--target megatron` searches state any stage split Megatron runs (--pipeline-model-parallel-layout),
and a `--target` search whose exports all outgrow the devices ends non-zero naming the nearest (issue
52 finding 5), checked with Megatron-Core's own layout parser where the `engines` extra is installed."""
from __future__ import annotations

import pytest

import sapp.engines as E
from sapp.engines.megatron import tokens

from tests import engine_validate


@pytest.fixture(scope="module")
def deepseek():
    from sapp import api
    graph = api.capture_graph(api.resolve_model("deepseek-v3-like")[0])[0]
    return graph, api.resolve_cluster("h100-80g:nodes=32")


@pytest.fixture(scope="module")
def pinned(deepseek):
    from sapp import api
    graph, cl = deepseek
    return api.search("deepseek-v3-like", cl, graph=graph, global_batch=2048, runtime="fused",
                      constraints={"target": "megatron", "tp": 1, "pp": 16, "ep": 8, "dp": 16})


def _stages(plan):
    return [len(s["blocks"]) for s in sorted(plan["pipeline"]["stages"], key=lambda s: s["index"])]


def test_deepseek_target_megatron_fits_with_the_layout_the_search_found(deepseek):
    # the split was forced to Megatron's first / last flags: 146.26 GB a device of 77.6 usable, exit 0
    graph, cl = deepseek
    plan = E.best_plan(graph, cl, "megatron", global_batch=2048, model="deepseek-v3-like", must_fit=True,
                       settings={"precision": None, "runtime": "fused"})
    assert plan["predicted"]["peak_memory_bytes"] <= cl.usable_memory
    text, exported, notes = E.export_plan(plan, "megatron", graph=graph, cluster=cl)
    assert notes == [] and exported is plan            # the file is the plan, nothing conformed
    args, stages = tokens(text), _stages(plan)
    if len(set(stages[1:-1])) > 1:
        assert args["--pipeline-model-parallel-layout"] == "E" + "|".join("t" * k for k in stages) + "L"
        assert "--decoder-first-pipeline-num-layers" not in args
    back = E.import_config(text, "megatron", graph, cl, "deepseek-v3-like")
    assert _stages(back) == stages
    assert back["predicted"]["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"], rel=1e-9)
    assert back["predicted"]["peak_memory_bytes"] == pytest.approx(plan["predicted"]["peak_memory_bytes"], rel=1e-9)


def test_an_uneven_middle_split_is_exported_as_megatron_lays_it_out(deepseek, pinned):
    from sapp.engines.mapping import from_plan, price
    graph, cl = deepseek
    plan = pinned
    split = [5, 4, 4, 4, 4, 4, 3, 4, 4, 4, 4, 3, 3, 4, 4, 3]      # the search's split the old export moved
    names, mod = E.block_names(graph), E.get("megatron")
    ecfg, notes = mod.conform(from_plan(plan, "megatron").replace(device_blocks=split, schedule="1f1b"), names)
    assert ecfg.device_blocks == split and not [n for n in notes if "stages" in n], notes
    facts = {**E.model_facts(plan["model"]["meta"], names), **E.arch_facts("deepseek-v3-like", plan["model"]["meta"], 61)}
    text = mod.export(ecfg, facts, names)
    priced = price(graph, cl, ecfg, name="deepseek-v3-like")
    back = E.import_config(text, "megatron", graph, cl, "deepseek-v3-like")
    assert _stages(back) == split
    assert back["predicted"]["step_time_s"] == pytest.approx(priced["predicted"]["step_time_s"], rel=1e-9)
    try:
        _, tc = engine_validate.megatron(text)
    except ImportError:
        return
    # Megatron-Core's own PipelineParallelLayerLayout: the decoder layers of each pipeline rank
    from megatron.core.transformer.enums import LayerType
    layout = tc.pipeline_model_parallel_layout
    assert [layout.layout[i][0].count(LayerType.decoder) for i in range(16)] == split
    assert layout.layout[0][0][0] == LayerType.embedding and layout.layout[15][0][-1] == LayerType.loss


def test_a_target_search_that_fits_nothing_exits_non_zero_naming_the_nearest(capsys):
    from sapp.commands.cli import main
    rc = main(["search", "--model", "deepseek-v3-like", "--cluster", "h100-80g:nodes=4", "--target", "megatron"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1, err
    assert "GB per device" in err and "pp=" in err, err


def test_the_nearest_miss_names_the_configuration_and_its_peak(deepseek, pinned):
    from sapp.engines.mapping import from_plan, price
    graph, cl = deepseek
    plan = pinned
    # the old export's split: everything past the equal middle stages on the first and the last
    ecfg = from_plan(plan, "megatron").replace(device_blocks=[10] + [3] * 14 + [9], schedule="1f1b")
    big = price(graph, cl, ecfg, name="deepseek-v3-like")
    assert big["predicted"]["peak_memory_bytes"] > cl.usable_memory
    e = E.near_miss("megatron", [big], cl)
    msg = str(e)
    assert "\n" not in msg and "pp=16" in msg and "77.60 GB usable" in msg, msg
    assert e.needed_bytes == big["predicted"]["peak_memory_bytes"]
