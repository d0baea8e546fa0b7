"""The engines' published example configurations import as they run (issue 36 items 4 and 5):
Megatron-LM's GPT-3 175B and Mixtral examples beside Megatron's own memory estimator, fp32 main_grads
priced where Megatron keeps them, the import's comparison over the engine's whole space, and
DeepSpeedExamples' ZeRO-1/2/3 and offload configurations (bench/published_engine_examples.py)."""
from __future__ import annotations

import json

import pytest

from bench import published_engine_examples as B
from sapp.engines.megatron_estimate import estimate
from sapp import api
from sapp.engines import best_plan, comparison, export_plan, import_config
from sapp.engines.megatron import tokens

GPT3, MIXTRAL = B.ROWS[0], B.ROWS[1]
GIB = 1024 ** 3


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="module")
def mixtral():
    module = api.resolve_model("mixtral-8x7b")[0]
    return module, api.capture_graph(module)[0]


def test_the_estimator_port_gives_megatrons_figures():
    # MB figures printed by megatron/training/theoretical_memory_usage.py's report_theoretical_memory itself
    # (core_v0.16.1 and main d98e8a64dd, run on these arguments with the same resolved values)
    g = tokens(_read(GPT3[2]))
    assert estimate(g, world_size=128, vocab=50257, version="core_v0.16.1")["total_mb"] == pytest.approx(56531.70, abs=0.01)
    assert estimate(g, world_size=128, vocab=50257)["total_mb"] == pytest.approx(56536.15, abs=0.01)
    m = tokens(_read(MIXTRAL[2]))
    assert estimate(m, world_size=64, vocab=32000, version="core_v0.16.1")["total_mb"] == pytest.approx(93925.91, abs=0.01)
    assert estimate(m, world_size=64, vocab=32000)["total_mb"] == pytest.approx(37479.60, abs=0.01)
    # main divides the experts by ep: ep 8 -> 4 adds the experts' share back
    m4 = {**m, "--expert-model-parallel-size": "4"}
    assert estimate(m4, world_size=64, vocab=32000)["weights_mb"] > estimate(m, world_size=64, vocab=32000)["weights_mb"]


def test_megatron_gpt3_example_fits_within_ten_percent_of_megatrons_estimate():
    plan, cl, _ = B.price(GPT3)
    peak = plan["predicted"]["peak_memory_bytes"]
    assert peak <= cl.usable_memory
    est = B.estimator(GPT3)["main"]
    assert abs(peak / est - 1) <= 0.10, (peak / GIB, est / GIB)
    assert not plan["settings"].get("grad_fp32")        # --fp16 keeps fp16 main_grads unless told otherwise


def test_megatron_mixtral_example_fits_with_fp32_main_grads(mixtral):
    plan, cl, _ = B.price(MIXTRAL)
    pr = plan["predicted"]
    assert pr["peak_memory_bytes"] <= cl.usable_memory
    assert plan["settings"]["grad_fp32"] is True       # --bf16 without --grad-reduce-in-bf16
    mem = pr["memory"]
    states = mem["params"] + mem["grads"] + mem["optimizer"]
    assert states == pytest.approx(B.estimator(MIXTRAL)["weights"], rel=0.01)
    # the same file with --grad-reduce-in-bf16: half the gradient bytes, less reduce traffic
    text = _read(MIXTRAL[2]) + "--grad-reduce-in-bf16\n"
    half = import_config(text, "megatron", mixtral[1], cl, "mixtral-8x7b")
    assert not half["settings"].get("grad_fp32")
    assert half["predicted"]["memory"]["grads"] == pytest.approx(mem["grads"] / 2, rel=1e-5)
    assert half["predicted"]["comm_by_kind"]["dp_grad_sync"] < pr["comm_by_kind"]["dp_grad_sync"]
    # exports write what was priced, and read back the same
    for p, flag in ((plan, False), (half, True)):
        out, exported, notes = export_plan(p, "megatron", graph=mixtral[1], cluster=cl)
        assert ("--grad-reduce-in-bf16" in tokens(out)) is flag and not notes
        back = import_config(out, "megatron", mixtral[1], cl, "mixtral-8x7b")
        assert back["settings"].get("grad_fp32", False) is (not flag)
        assert back["predicted"]["step_time_s"] == pytest.approx(p["predicted"]["step_time_s"], rel=1e-5)


def test_fp16_accumulating_in_fp32_is_priced_so():
    from sapp.engines.megatron import _grad_fp32
    assert _grad_fp32({"--fp16": True}) is False
    assert _grad_fp32({"--fp16": True, "--accumulate-allreduce-grads-in-fp32": True}) is True
    assert _grad_fp32({"--bf16": True}) is True and _grad_fp32({"--bf16": True, "--grad-reduce-in-bf16": True}) is False


def test_the_import_comparison_is_never_beaten_by_a_pinned_variant(mixtral):
    module, graph = mixtral
    cl = api.resolve_cluster("h100-80g:devices=32")
    mine = import_config(_read(MIXTRAL[2]), "megatron", graph, cl, "mixtral-8x7b")
    st = {"runtime": "fused", "precision": "bf16-mixed", "optimizer": "adam", "grad_fp32": True}
    best = best_plan(graph, cl, "megatron", global_batch=256, settings=st, model=module)
    line = comparison(mine, best)
    assert "nothing faster" not in line, line
    # the pinned variant the free search's per-block recompute mix hid (pp 4, ep 8), as Megatron runs it
    pinned = api.search(graph=graph, model=module, cluster=cl, global_batch=256,
                        constraints={"target": "megatron", "pp": 4, "ep": 8, "recompute": "none"}, **st)
    pinned = export_plan(pinned, "megatron", graph=graph, cluster=cl)[1]
    assert best["predicted"]["step_time_s"] <= pinned["predicted"]["step_time_s"] * (1 + 1e-9)
    assert best["predicted"]["step_time_s"] < mine["predicted"]["step_time_s"]


def test_deepspeed_examples_fit_and_offload_is_what_makes_the_2b_model_fit():
    peaks = []
    for row in B.ROWS[2:5]:
        plan, cl, _ = B.price(row)
        peaks.append(plan["predicted"]["peak_memory_bytes"])
        assert peaks[-1] <= cl.usable_memory
        assert plan["zero"] == int(row[2][-6])
    assert peaks[0] > peaks[1] > peaks[2]          # each ZeRO stage shards more
    off = B.ROWS[5]
    plan, cl, _ = B.price(off)
    assert plan["predicted"]["peak_memory_bytes"] <= cl.usable_memory
    assert plan["placement"]["predicted"]["option"] == "optimizer-host"
    on_gpu, _, _ = B.price(off, B.without_offload(off[2]))
    assert on_gpu["predicted"]["peak_memory_bytes"] > cl.usable_memory
    from sapp.engines import deepspeed
    from sapp.engines.mapping import from_plan
    out = json.loads(deepspeed.export(from_plan(plan, "deepspeed"), {}, []))
    assert out["zero_optimization"]["stage"] == 1 and out["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
