"""A plan predicted above the best public MFU on its GPU says so and names the terms it rests on (issue 54
item 6); one below says nothing.  Hand-built GPT graph (no capture: fast)."""
import pytest

from bench.random_graphs import gpt_graph
from sapp.cluster import public_mfu
from sapp.cluster.public_mfu import BEST_PUBLIC_MFU, best_public, gpu_kind
from sapp.cluster import Cluster
from sapp.search.joint import joint_search
from sapp.search.joint.terms import public_mfu_note, step_terms

MARK = "exceeds the best public run"


@pytest.fixture(scope="module")
def graph():
    return gpt_graph(layers=4, b=2, s=1024, h=2048, a=16, vocab=8192)


def _note(res):
    return [n for n in res.notes if MARK in n]


def test_below_the_best_public_run_no_note(graph):
    r = joint_search(graph, Cluster.parse("h100-80g:nodes=1"), global_batch=16)
    assert r.mfu < BEST_PUBLIC_MFU["H100"].mfu
    assert _note(r) == []


def test_uncalibrated_preset_above_gets_the_note_with_its_terms(graph, monkeypatch):
    # the same plan against a best public run set below it: the note appears, names the GPU, the figure,
    # the terms of the step and the way to check it
    low = public_mfu.PublicBest("H100", 0.05, "test run", 989e12)
    monkeypatch.setitem(public_mfu._TABLE, "H100", low)
    r = joint_search(graph, Cluster.parse("h100-80g:nodes=1"), global_batch=16)
    (note,) = _note(r)
    assert f"predicted MFU {r.mfu:.1%} exceeds the best public run on H100 (5.0%, test run)" in note
    for term in ("compute", "exposed communication", "bubble", "recomputation", "micro-batch", "peak memory"):
        assert term in note
    assert "sapp calibrate --from-run" in note and "datasheet" in note


def test_own_figures_above_say_so_differently(graph):
    # a cluster file that claims a 3x faster H100 than the datasheet: the plan passes the public best and
    # the note says the figures are the cluster's own, not a preset's
    c = Cluster.parse("h100-80g:nodes=1,peak_flops=3000e12,mem_bandwidth=30e12")
    r = joint_search(graph, c, global_batch=16)
    (note,) = _note(r)
    assert "this cluster's figures are its own" in note and "datasheet figures" not in note


@pytest.mark.parametrize("schedule", ["1f1b", "dualpipev"])
def test_terms_add_up_to_the_step(graph, schedule):
    r = joint_search(graph, Cluster.parse("a100-80g:nodes=1"), global_batch=64,
                     constraints={"pp": 2, "schedule": schedule})
    assert r.config.schedule == schedule
    t = step_terms(r)
    assert sum(t.values()) == pytest.approx(r.step_time_s)
    assert t["compute"] > 0 and abs(t["other"]) < 0.05 * r.step_time_s
    # 1F1B idles every stage (p - 1) micro-batch slots; DualPipeV's V lets the faster rank keep the
    # slower one fed, so its critical rank may idle next to nothing (the simulator's answer here)
    assert t["bubble"] > 0 if schedule == "1f1b" else t["bubble"] >= 0


def test_gpu_kinds_and_fp8():
    assert gpu_kind(Cluster.parse("h200")) == "H200" and best_public(Cluster.parse("h200"))[1].kind == "H100"
    assert gpu_kind(Cluster.parse("a100-80g").replace(name="a100-80g-calibrated")) == "A100"
    assert gpu_kind(Cluster.parse("v100-32g")) == "V100"
    assert gpu_kind(Cluster.parse("cpu")) is None

    class Fp8:
        fp8 = "tensorwise"
    # FP8 linears: the table's bf16 runs are no yardstick, so no note either way
    assert public_mfu_note(Cluster.parse("h100-80g"), Fp8(), None) is None
