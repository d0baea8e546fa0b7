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
