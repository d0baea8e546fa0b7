"""Expert parallelism beside tensor parallelism as Megatron-LM runs it (--expert-tensor-parallel-size =
tp): priced (costmodel/moe.py), imported and exported for Megatron, offered to the search under
--target megatron only, refused by sapp run in one line."""
from __future__ import annotations

import pytest

from sapp import api
from sapp.costmodel import CostSettings
from sapp.costmodel.moe import ep_unit_delta
from sapp.engines import EngineError, export_plan, import_config
from sapp.engines.megatron import tokens

EXAMPLE = "bench/megatron_args/example_mixtral_8x7b.args"


def _text(tp=2, extra=""):
    with open(EXAMPLE, encoding="utf-8") as f:
        t = f.read()
    return t.replace("--tensor-model-parallel-size 1\n", f"--tensor-model-parallel-size {tp}\n") + extra


@pytest.fixture(scope="module")
def mixtral():
    module = api.resolve_model("mixtral-8x7b")[0]
    return module, api.capture_graph(module)[0]


def test_experts_split_over_tp_hold_and_compute_a_tp_th():
    facts = {"rows": 8192.0, "hidden": 4096, "top_k": 2, "expert_flops": 1e12, "expert_params": 1.4e9,
             "capacity_factor": 0.0}
    cl = api.resolve_cluster("h100-80g:devices=64")
    st = CostSettings(runtime="fused")
    P = facts["expert_params"]
    from sapp.costmodel.primitives import model_state_bytes
    before = model_state_bytes(P, 8, 1, st)
    held = {tp: {k: before[k] + v for k, v in ep_unit_delta(facts, dp=8, tp=tp, ep=4, mbs=1, zero=1, cluster=cl,
                                                             settings=st, stage_devices=8 * tp)["states"].items()}
            for tp in (1, 2, 4)}
    for k in ("params", "grads", "optimizer"):
        assert held[2][k] == pytest.approx(held[1][k] / 2) and held[4][k] == pytest.approx(held[1][k] / 4)
    f1, f2 = (ep_unit_delta(facts, dp=8, tp=tp, ep=4, mbs=1, zero=1, cluster=cl, settings=st,
                            stage_devices=8 * tp)["fwd_s"] for tp in (1, 2))
    assert f2 < f1          # half of every expert's GEMMs, the row all-gather / reduce-scatter beside it


def test_megatron_tp2_ep8_imports_priced_and_exports_back(mixtral):
    module, graph = mixtral
    cl = api.resolve_cluster("h100-80g:devices=128")
    plan = import_config(_text(2), "megatron", graph, cl, "mixtral-8x7b")
    assert (plan["parallel"]["tp"], plan["parallel"]["ep"], plan["parallel"]["dp"]) == (2, 8, 16)
    one = import_config(_text(1), "megatron", graph, api.resolve_cluster("h100-80g:devices=64"), "mixtral-8x7b")
    assert plan["predicted"]["memory"]["params"] < 0.6 * one["predicted"]["memory"]["params"]
    out, exported, notes = export_plan(plan, "megatron", graph=graph, cluster=cl)
    a = tokens(out)
    assert a["--expert-tensor-parallel-size"] == "2" and a["--expert-model-parallel-size"] == "8"
    assert a["--sequence-parallel"] is True         # (this model has no op sapp splits by sequence: noted, same price)
    assert exported["predicted"]["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"], rel=1e-5)
    back = import_config(out, "megatron", graph, cl, "mixtral-8x7b")
    assert back["predicted"]["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"], rel=1e-5)
    from sapp.emit.ep import experts
    from sapp.errors import PlanError
    with pytest.raises(PlanError, match="tp=1"):
        experts.check(plan, module)


@pytest.mark.parametrize("extra,match", [("--expert-tensor-parallel-size 1\n", "expert-tp = tp"),
                                         ("--expert-tensor-parallel-size 4\n", "give 2")])
def test_other_expert_tp_refused_in_one_line(mixtral, extra, match):
    cl = api.resolve_cluster("h100-80g:devices=128")
    with pytest.raises(EngineError, match=match) as e:
        import_config(_text(2, extra), "megatron", mixtral[1], cl, "mixtral-8x7b")
    assert "\n" not in str(e.value)


def test_ep_beside_tp_needs_sequence_parallel_as_megatron_says(mixtral):
    cl = api.resolve_cluster("h100-80g:devices=128")
    text = _text(2).replace("--sequence-parallel\n", "")
    with pytest.raises(EngineError, match="--sequence-parallel"):
        import_config(text, "megatron", mixtral[1], cl, "mixtral-8x7b")


def test_offered_to_the_search_under_target_megatron_only(mixtral):
    from sapp.search.constraints import Constraints
    from sapp.search.joint import Config
    from sapp.search.joint.context import SearchContext
    from sapp.search.joint.ep import ep_configs
    cl = api.resolve_cluster("h100-80g:devices=64")
    cfg = Config(4, 8, 2, 16, 1, "1f1b", 1, 1, sp=True)
    for target, offered in ((None, False), ("torchtitan", False), ("megatron", True)):
        ctx = SearchContext(mixtral[1], cl, 256, Constraints.from_dict({"target": target} if target else {}),
                            CostSettings(), None)
        assert bool(ep_configs(ctx, cfg)) is offered, target
    ctx = SearchContext(mixtral[1], cl, 256, Constraints.from_dict({"target": "megatron"}), CostSettings(), None)
    assert ep_configs(ctx, Config(4, 8, 2, 16, 1, "1f1b", 1, 1, sp=False)) == []


def test_experts_split_over_tp_keep_a_tp_th_of_their_ffn_width():
    # what a rank keeps for backward in the experts' ffn width (up/gate outputs, the down GEMM's input)
    facts = {"rows": 8192.0, "hidden": 4096, "top_k": 2, "expert_flops": 1e12, "expert_params": 1.4e9,
             "capacity_factor": 0.0, "ffn_row_elems": 3 * 14336}
    cl = api.resolve_cluster("h100-80g:devices=64")
    st = CostSettings(runtime="fused")
    whole = facts["rows"] * facts["ffn_row_elems"] * 2          # bf16, every tp rank holding every row's width
    got = {tp: ep_unit_delta(facts, dp=8, tp=tp, ep=4, mbs=1, zero=1, cluster=cl, settings=st,
                             stage_devices=8 * tp)["act_per_sample"] for tp in (1, 2, 4)}
    assert got[1] == 0.0
    assert whole + got[2] == pytest.approx(whole / 2) and whole + got[4] == pytest.approx(whole / 4)


def test_the_tp2_import_holds_the_experts_ffn_activations_at_half(mixtral, monkeypatch):
    import sapp.search.joint.ep as E
    cl = api.resolve_cluster("h100-80g:devices=128")
    split = import_config(_text(2), "megatron", mixtral[1], cl, "mixtral-8x7b")["predicted"]["memory"]["activations"]
    real = E.ep_unit_delta
    monkeypatch.setattr(E, "ep_unit_delta", lambda *a, **k: {**real(*a, **k), "act_per_sample": 0.0})
    whole = import_config(_text(2), "megatron", mixtral[1], cl, "mixtral-8x7b")["predicted"]["memory"]["activations"]
    # Mixtral: 4096 tokens x top-2 a layer, 3 x 14336 ffn elements a row, bf16: 704.6 MB a layer and micro-batch,
    # half of it off at tp 2; the first stage of pp 4 holds 8 layers of several micro-batches
    assert whole - split >= 8 * 0.5 * 8192 * 3 * 14336 * 2
