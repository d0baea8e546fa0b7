"""Joint search on a hand-built GPT graph (no capture: fast): feasibility, memory, determinism,
pins, infeasibility, and the gap to an exhaustive enumeration over the same cost model."""
import pytest

from sapp.cluster import Cluster
from sapp.errors import ConstraintError, InfeasibleError
from bench.joint_exhaustive import exhaustive_search
from sapp.search.joint import joint_search
from bench.random_graphs import gpt_graph


@pytest.fixture(scope="module")
def graph():
    return gpt_graph(layers=8, b=2, s=512, h=1024, a=16, vocab=8192)


def cl(spec):
    return Cluster.parse(spec)


def test_finds_a_feasible_plan_under_capacity(graph):
    c = cl("a100-80g:nodes=1,device_memory=3GB")
    r = joint_search(graph, c, global_batch=64)
    cfg = r.config
    assert cfg.pp * cfg.dp * cfg.tp == 8
    assert cfg.dp * cfg.m * cfg.mbs == 64
    assert r.peak_memory_bytes <= c.device_memory
    assert all(s.memory_bytes <= c.device_memory for s in r.stages)
    assert sum(len(s.blocks) for s in r.stages) == 8
    assert 0 < r.mfu < 1
    assert r.stats["evaluated"] + r.stats["pruned"] == r.stats["configs"]


def test_same_inputs_same_answer(graph):
    c = cl("a100-80g:nodes=1")
    a = joint_search(graph, c, global_batch=32)
    b = joint_search(graph, c, global_batch=32)
    assert a.config == b.config and a.step_time_s == b.step_time_s
    assert [s.blocks for s in a.stages] == [s.blocks for s in b.stages]


def test_memory_pressure_turns_on_recompute_or_zero(graph):
    roomy = joint_search(graph, cl("a100-80g:nodes=1"), global_batch=64, constraints={"pp": 1, "dp": 8, "micro_batches": 1})
    tight_c = cl("a100-80g:nodes=1,device_memory=1.2GB")
    tight = joint_search(graph, tight_c, global_batch=64, constraints={"pp": 1, "dp": 8, "micro_batches": 1})
    pol = {p for s in tight.stages for p in s.recompute.values()}
    assert tight.peak_memory_bytes <= tight_c.device_memory
    assert pol != {"none"} or tight.config.zero > roomy.config.zero
    assert tight.step_time_s >= roomy.step_time_s


def test_pinned_configuration_is_scored_as_given(graph):
    c = cl("a100-80g:nodes=1")
    pins = {"tp": 2, "pp": 2, "dp": 2, "micro_batches": 8, "schedule": "gpipe", "zero": 2, "recompute": "full"}
    r = joint_search(graph, c, global_batch=32, constraints=pins)
    assert (r.config.tp, r.config.pp, r.config.dp, r.config.m, r.config.schedule, r.config.zero) == (2, 2, 2, 8, "gpipe", 2)
    assert {p for s in r.stages for p in s.recompute.values()} == {"full"}
    assert [s.in_flight for s in r.stages] == [8, 8]
    staged = joint_search(graph, c, global_batch=32, constraints=dict(pins, stages={"layers.0": 0, "layers.2": 1}))
    assert [len(s.blocks) for s in staged.stages] == [2, 6]
    assert staged.step_time_s >= r.step_time_s - 1e-12       # the searched split is at least as good


def test_infeasible_reports_memory_needed(graph):
    c = cl("a100-80g:nodes=1,device_memory=20MB")
    with pytest.raises(InfeasibleError) as e:
        joint_search(graph, c, global_batch=64)
    assert e.value.needed_bytes > c.device_memory
    msg = str(e.value)
    assert "\n" not in msg and "needs" in msg and "pp=" in msg


@pytest.mark.parametrize("pins,match", [
    ({"tp": 3}, "divide a node"),
    ({"tp": 2, "dp": 2, "pp": 3}, "devices"),
    ({"pp": 2, "schedule": "interleaved", "virtual_chunks": 8}, "blocks"),
    ({"stages": {"layers.0": 0, "layers.3": 2}}, "contiguous"),
    ({"bogus": 1}, "unknown constraint"),
    ({"recompute": "sometimes"}, "recompute"),
    ({"pp": 1, "schedule": "1f1b"}, "pp > 1"),
    ({"pp": 2, "schedule": "1f1b", "micro_batches": 1}, "micro_batches >= pp"),
])
def test_contradictions_are_one_line_constraint_errors(graph, pins, match):
    with pytest.raises(ConstraintError, match=match) as e:
        joint_search(graph, cl("a100-80g:nodes=1"), global_batch=64, constraints=pins)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("spec,batch,mem", [("a100-80g:nodes=1", 64, "2GB"), ("a100-80g:nodes=2", 64, "80GB")])
def test_within_one_percent_of_exhaustive(graph, spec, batch, mem):
    c = cl(f"{spec},device_memory={mem}")
    r = joint_search(graph, c, global_batch=batch)
    e, scored = exhaustive_search(graph, c, global_batch=batch)
    assert scored > 100
    assert r.step_time_s <= e.step_time_s * 1.01


def test_fewer_micro_batches_than_stages_run_gpipe(graph):
    # torch's 1F1B schedules refuse m < pp; pinned m=1 over 2 stages is searched as GPipe
    r = joint_search(graph, cl("a100-80g:nodes=1"), global_batch=64, constraints={"pp": 2, "micro_batches": 1})
    assert r.config.pp == 2 and r.config.m == 1 and r.config.schedule == "gpipe"


def test_divisors_match_a_hand_list_and_stay_fast_on_huge_inputs():
    from sapp.search.joint import divisors
    assert divisors(1) == [1]
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert divisors(97) == [1, 97]
    # 2^40: a linear loop would take ~10^12 steps; sqrt is 2^20
    assert divisors(2 ** 40) == [2 ** k for k in range(41)]
