"""Expert parallelism beside tensor parallelism as Megatron-LM runs it (--expert-tensor-parallel-size =
tp, or 1: experts whole on the ep x tp ranks): priced (costmodel/moe.py), imported and exported for Megatron, offered to the search under
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


@pytest.mark.parametrize("extra,match", [("--expert-tensor-parallel-size 4\n", "give 2 or 1"),
                                         ("--expert-tensor-parallel-size 1\n--expert-model-parallel-size 3\n",
                                          "a multiple of 2")])
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


def _etp1(tp=2, ep_m=8):
    t = _text(tp, f"--expert-tensor-parallel-size 1\n")
    return t.replace("--expert-model-parallel-size 8\n", f"--expert-model-parallel-size {ep_m}\n")


def test_experts_whole_beside_tp_hold_the_same_ranks_states_and_skip_the_row_exchange():
    """etp 1 at tp 2 over sapp's ep 4 (Megatron's ep 8) against etp = tp over sapp's ep 8: both groups hold
    1/(ep tp) of the experts a rank at etp 1 over ep 4 x tp 2 = 8 ranks, as etp 2 over ep 4; the all-to-all
    spans all 8 ranks and no rows are all-gathered over tp; 1/tp of the routed rows' hidden width kept."""
    facts = {"rows": 8192.0, "hidden": 4096, "top_k": 2, "expert_flops": 1e12, "expert_params": 1.4e9,
             "capacity_factor": 0.0, "ffn_row_elems": 3 * 14336}
    cl = api.resolve_cluster("h100-80g:devices=64")
    st = CostSettings(runtime="fused")
    kw = dict(dp=8, tp=2, ep=4, mbs=1, zero=1, cluster=cl, settings=st, stage_devices=16)
    split, whole = ep_unit_delta(facts, **kw), ep_unit_delta(facts, **kw, etp=1)
    assert whole["states"] == split["states"] and whole["sync_s"] == split["sync_s"]
    from sapp.costmodel.moe import dispatch_combine_time, expert_tp_gather
    gather = expert_tp_gather(facts["rows"], facts["hidden"], 2.0, 2, cl)
    a2a_split = dispatch_combine_time(4096 / 2, 2, 4096, 2.0, 4, 4, cl)[0]
    a2a_whole = dispatch_combine_time(4096 / 2, 2, 4096, 2.0, 8, 8, cl)[0]
    assert whole["fwd_s"] - split["fwd_s"] == pytest.approx(a2a_whole - a2a_split - gather, rel=1e-6, abs=1e-12)
    assert whole["act_per_sample"] - split["act_per_sample"] == pytest.approx(-0.5 * 8192 * 4096 * 2)


def test_megatron_etp1_imports_exports_and_round_trips(mixtral):
    cl = api.resolve_cluster("h100-80g:devices=64")
    plan = import_config(_etp1(), "megatron", mixtral[1], cl, "mixtral-8x7b")
    par = plan["parallel"]
    assert (par["tp"], par["ep"], par["dp"], par.get("etp")) == (2, 4, 8, 1)
    split = import_config(_text(2), "megatron", mixtral[1], cl, "mixtral-8x7b")   # Megatron ep 8 at etp 2
    assert split["parallel"]["ep"] == 8 and "etp" not in split["parallel"]
    # 8 experts whole on 8 ranks against 8 halves on 16: twice the expert states a rank
    assert plan["predicted"]["memory"]["params"] > 1.5 * split["predicted"]["memory"]["params"]
    out, exported, notes = export_plan(plan, "megatron", graph=mixtral[1], cluster=cl)
    a = tokens(out)
    assert a["--expert-tensor-parallel-size"] == "1" and a["--expert-model-parallel-size"] == "8" and not notes
    back = import_config(out, "megatron", mixtral[1], cl, "mixtral-8x7b")
    assert back["predicted"]["step_time_s"] == plan["predicted"]["step_time_s"]
    V = pytest.importorskip("engine_validate")
    pytest.importorskip("megatron.core")
    mp, tc = V.megatron(out)
    assert tc.expert_tensor_parallel_size == 1 and tc.expert_model_parallel_size == 8


def test_the_search_weighs_experts_whole_under_target_megatron(mixtral):
    from sapp.search.constraints import Constraints
    from sapp.search.joint import Config
    from sapp.search.joint.context import SearchContext
    from sapp.search.joint.ep import ep_configs
    cl = api.resolve_cluster("h100-80g:devices=64")
    cfg = Config(4, 8, 2, 16, 1, "1f1b", 1, 1, sp=True)
    ctx = SearchContext(mixtral[1], cl, 256, Constraints.from_dict({"target": "megatron"}), CostSettings(), None)
    got = {(c.ep, c.etp) for c in ep_configs(ctx, cfg)}
    assert got == {(2, 0), (4, 0), (8, 0), (2, 1), (4, 1)}        # etp 1 needs E = 8 to split over ep x tp
    ctx = SearchContext(mixtral[1], cl, 256, Constraints.from_dict({"target": "megatron", "etp": 0}), CostSettings(),
                        None)
    assert {c.etp for c in ep_configs(ctx, cfg)} == {0}


@pytest.mark.parametrize("pins, says", [({"etp": 1}, "target megatron only"),
                                        ({"ep": 2, "zero": 3}, "priced at ZeRO-0/1")])
def test_pins_refused_in_one_line(pins, says):
    from sapp.search.constraints import ConstraintError, Constraints
    with pytest.raises(ConstraintError, match=says) as e:
        Constraints.from_dict(pins)
    assert "\n" not in str(e.value)


MIRROR = "/work/.mirror/NVIDIA+Megatron-LM/repo"


@pytest.mark.skipif(not __import__("os").path.isdir(MIRROR), reason="needs the fetched Megatron-LM")
def test_megatron_lm_parse_args_accepts_etp1(mixtral, tmp_path):
    from bench.megatron_accepts import EXTRA, argv_of, environment_of, extract, run_megatron
    cl = api.resolve_cluster("h100-80g:devices=64")
    plan = import_config(_etp1(), "megatron", mixtral[1], cl, "mixtral-8x7b")
    out, _, _ = export_plan(plan, "megatron", graph=mixtral[1], cluster=cl)
    extract(MIRROR, "core_v0.16.1", str(tmp_path))
    res = run_megatron(str(tmp_path), argv_of(out) + EXTRA, 64, 9, environment_of(out))
    assert res["accepted"], res.get("error")
    assert res["derived"]["expert_tensor_parallel_size"] == 1 and res["derived"]["expert_model_parallel_size"] == 8


def test_megatrons_default_etp_at_ep1_beside_tp_is_refused_in_one_line(mixtral):
    # Megatron splits each expert over tp there (etp defaults to tp); sapp prices them whole on each rank
    cl = api.resolve_cluster("h100-80g:devices=64")
    text = _text(2).replace("--expert-model-parallel-size 8\n", "--expert-model-parallel-size 1\n")
    with pytest.raises(EngineError, match="at --expert-model-parallel-size 1") as e:
        import_config(text, "megatron", mixtral[1], cl, "mixtral-8x7b")
    assert "\n" not in str(e.value)
    plan = import_config(text + "--expert-tensor-parallel-size 1\n", "megatron", mixtral[1], cl, "mixtral-8x7b")
    out, _, _ = export_plan(plan, "megatron", graph=mixtral[1], cluster=cl)
    assert tokens(out)["--expert-tensor-parallel-size"] == "1"
