"""torchtitan's HSDP (data_parallel_replicate_degree > 1 beside data_parallel_shard_degree > 1): FSDP2
shards within each shard group and all-reduces the gradient shards across the replicas.  Priced so
(ZeRO over the shard group, the replicas' all-reduce of each unit's gradient shard), imported from
torchtitan 0.2.2's TOML and 0.3's Python, exported back, parsed by torchtitan 0.2.2's ConfigManager and
ParallelDims, offered to --target torchtitan searches only, refused by the other engines and sapp run."""
from __future__ import annotations

import pytest

import sapp.engines as E
from sapp import api
from sapp.costmodel import CostSettings, collective_time
from sapp.errors import SappError

from tests import engine_validate as V

MODEL = "llama3-8b"


def _toml(rep, shard, reshard="always", extra=""):
    return (f'[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\ndata_parallel_replicate_degree = {rep}\n'
            f'data_parallel_shard_degree = {shard}\nfsdp_reshard_after_forward = "{reshard}"\n'
            f'[training]\nlocal_batch_size = 1\nglobal_batch_size = {rep * shard}\n{extra}'
            f'[activation_checkpoint]\nmode = "full"\n')


@pytest.fixture(scope="module")
def graph():
    return api.capture_graph(api.resolve_model(MODEL)[0])[0]


def _import(graph, text, cluster, engine="torchtitan@0.2.2"):
    return E.import_config(text, engine, graph, api.resolve_cluster(cluster), MODEL)


def _states(plan):
    return sum(plan["predicted"]["memory"][k] for k in ("params", "grads", "optimizer"))


def test_hsdp_is_priced_as_fsdp_within_the_shard_group_plus_the_replicas_all_reduce(graph):
    hsdp = _import(graph, _toml(4, 8), "h100-80g:nodes=4")
    fsdp8 = _import(graph, _toml(1, 8), "h100-80g:nodes=1")       # one shard group alone
    fsdp32 = _import(graph, _toml(1, 32), "h100-80g:nodes=4")
    assert hsdp["parallel"] == {"dp": 32, "tp": 1, "pp": 1, "dp_replicate": 4} and hsdp["zero"] == 3
    # model states sharded over the 8 ranks of a group, not the 32 data-parallel ranks
    assert _states(hsdp) == pytest.approx(_states(fsdp8), rel=1e-12)
    assert _states(hsdp) == pytest.approx(4 * _states(fsdp32), rel=0.05)   # (3.9x: a few unsharded bytes)
    # the group's reduce-scatter inside a node, then each 1/8 gradient shard all-reduced across 4 nodes
    assert fsdp8["predicted"]["grad_sync_s"] < hsdp["predicted"]["grad_sync_s"] < fsdp32["predicted"]["grad_sync_s"]
    assert any("HSDP 4 replicas x 8 shards" in n for n in hsdp["notes"])


def test_the_replicas_all_reduce_is_one_shard_of_each_unit_at_fsdp2s_reduce_width(graph):
    from sapp.search.joint import Config
    from sapp.search.joint.numbers import replica_sync
    cl = api.resolve_cluster("h100-80g:nodes=4")
    st = CostSettings(runtime="torchtitan-0.2.2")

    class Ctx:
        settings, cluster = st, cl

    class Unit:
        states = {0: {"grads": 1e9 * st.grad_bytes}}
    cfg = Config(1, 32, 1, 1, 1, "none", 1, 3, rep=4)
    want = collective_time("all_reduce", 1e9 * 4 / 8, 4, "inter", cl)      # fp32 reduce, 1/8 shard, 4 nodes
    assert replica_sync(Unit, cfg, Ctx) == pytest.approx(want, rel=1e-12)
    assert replica_sync(Unit, Config(1, 32, 1, 1, 1, "none", 1, 3), Ctx) == 0.0


@pytest.mark.parametrize("engine", ["torchtitan@0.2.2", "torchtitan"])
def test_hsdp_exports_back_at_the_same_price(graph, engine, tmp_path):
    cl = api.resolve_cluster("h100-80g:nodes=4")
    plan = _import(graph, _toml(4, 8, reshard="never"), "h100-80g:nodes=4")
    text, exported, notes = E.export_plan(plan, engine, graph=graph, cluster=cl)
    if engine == "torchtitan":
        assert "data_parallel_replicate_degree=4," in text and "data_parallel_shard_degree=8," in text
    again = E.import_config(text, engine, graph, cl, MODEL)
    assert again["parallel"] == plan["parallel"] and again["zero"] == plan["zero"] == 2
    assert again["predicted"]["step_time_s"] == pytest.approx(exported["predicted"]["step_time_s"], rel=1e-9)
    if engine == "torchtitan@0.2.2":
        cfg = V.torchtitan_text(text, tmp_path)
        par = cfg.parallelism
        assert (par.data_parallel_replicate_degree, par.data_parallel_shard_degree) == (4, 8)
        from torchtitan.distributed.parallel_dims import ParallelDims
        dims = ParallelDims(dp_replicate=4, dp_shard=par.data_parallel_shard_degree, cp=1, tp=1, pp=1, ep=1, etp=1,
                            world_size=32)              # torchtitan's own degree checks at 32 GPUs
        assert dims.dp_replicate_enabled and dims.fsdp_enabled


def test_the_search_considers_hsdp_where_torchtitan_is_the_target_only(graph):
    from sapp.search.constraints import Constraints
    from sapp.search.joint.configs import enumerate_configs
    from sapp.search.joint.context import SearchContext
    cl = api.resolve_cluster("h100-80g:nodes=4")

    def reps(cons):
        ctx = SearchContext(graph, cl, 64, Constraints.from_dict(cons), CostSettings(), None)
        return {c.rep for c in enumerate_configs(ctx)}
    assert reps({"target": "torchtitan@0.2.2"}) == reps({"target": "torchtitan"}) == {1, 2, 4, 8, 16}
    assert reps({"target": "megatron"}) == reps({}) == {1}
    plan = api.search(MODEL, cl, graph=graph, global_batch=64, runtime="torchtitan",
                      constraints={"target": "torchtitan", "dp_replicate": 4, "cp": 1})
    assert plan["parallel"]["dp_replicate"] == 4 and plan["zero"] in (2, 3)
    with pytest.raises(E.EngineError, match="HSDP"):
        E.export_plan(plan, "megatron", graph=graph, cluster=cl)
    from sapp.emit.checks.plan import check_optimizer
    from sapp.errors import SappError
    with pytest.raises(SappError, match="dp_replicate=4 is torchtitan's HSDP"):
        check_optimizer(plan)
    from sapp.errors import ConstraintError
    with pytest.raises(ConstraintError, match="torchtitan targets only"):
        Constraints.from_dict({"target": "megatron", "dp_replicate": 2})


def test_hsdp_beside_expert_parallelism_is_refused_in_one_line(graph):
    with pytest.raises(E.EngineError, match="HSDP .* beside expert parallelism"):
        _import(graph, _toml(2, 16).replace("[training]", "expert_parallel_degree = 2\n[training]"),
                "h100-80g:nodes=4")



@pytest.mark.parametrize("extra", ['[compile]\nenable = true\ncomponents = ["model"]\n', ""])
def test_an_imported_hsdp_plan_is_judged_by_its_own_release(graph, extra):
    """A torchtitan 0.2.2 HSDP plan priced under any of that release's profiles (compiled blocks too) is
    re-scored by 0.2.2's rules: back at the step it was imported with, and, edited to tp without
    sequence parallelism (0.3 has the switch, 0.2.2's tensor-parallel plan always shards the norms), refused."""
    par = "tensor_parallel_degree = 2\n"
    plan = _import(graph, _toml(2, 4, extra=extra).replace("[parallelism]\n", "[parallelism]\n" + par), "h100-80g:nodes=2")
    assert plan._d["settings"]["runtime"] == ("torchtitan-0.2.2+compile" if extra else "torchtitan-0.2.2")
    back = api.evaluate(MODEL, "h100-80g:nodes=2", plan, graph=graph)
    assert back["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"], rel=1e-5)
    assert plan["parallel"]["sp"] is True
    plan._d["parallel"]["sp"] = False
    with pytest.raises(SappError, match="sequence"):
        api.evaluate(MODEL, "h100-80g:nodes=2", plan, graph=graph)
