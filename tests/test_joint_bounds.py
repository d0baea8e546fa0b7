"""Branch and bound's lower bounds are lower bounds (issue 14, item 6): with a calibrated
compute_scale < 1 every operator runs faster than the bare roofline, and a bound that ignores the
scale sits above the real step times and prunes the optimum.  Checked against exhaustive enumeration
over the same cost model (bench.joint_exhaustive), and directly: no configuration's exact time is
below its bound."""
import pytest

from bench.joint_exhaustive import exhaustive_search
from bench.random_graphs import gpt_graph
from sapp.cluster import Cluster
from sapp.search.constraints import Constraints
from sapp.costmodel import CostSettings
from sapp.search.joint import SearchContext, enumerate_configs, evaluate_config, joint_search
from sapp.search.joint.bounds import analytic_bound, profile_bound


@pytest.fixture(scope="module")
def big():
    # compute-bound enough (h 2048, s 1024) that the scaled roofline, not dispatch, sets the step
    return gpt_graph(layers=4, b=2, s=1024, h=2048, a=16, vocab=8192)


def test_search_finds_the_exhaustive_optimum_with_a_scale_below_one(big):
    # without the scale in the bound: the first pp=1 configuration evaluated (ZeRO-0) ends the
    # search 18.9% slower than the exhaustive optimum (ZeRO-1), every other one pruned
    c = Cluster.parse("a100-80g:nodes=1,gpus=4,compute_scale=0.3")
    r = joint_search(big, c, global_batch=16)
    e, _ = exhaustive_search(big, c, global_batch=16, exact_partition=False)
    assert r.step_time_s <= e.step_time_s * (1 + 1e-9)
    assert r.config == e.config


def test_no_exact_time_is_below_its_bounds(big):
    c = Cluster.parse("a100-80g:nodes=1,gpus=4,compute_scale=0.3")
    ctx = SearchContext(big, c, 16, Constraints.from_dict(None), CostSettings(), None)
    for cfg in enumerate_configs(ctx)[::3]:
        prof = ctx.profile(cfg.dp, cfg.tp, cfg.sp)
        res = evaluate_config(ctx, cfg, prof)
        if res is None:
            continue
        assert analytic_bound(ctx, cfg) <= res.step_time_s * (1 + 1e-9), cfg.describe()
        assert profile_bound(ctx, cfg, prof) <= res.step_time_s * (1 + 1e-9), cfg.describe()


def test_envelope_is_the_cheapest_fractional_mix():
    from sapp.search.joint.memory_bound import envelope
    # none: 10 bytes, 0 s; selective: 6 bytes, 1 s; full: 1 byte, 9 s (hand-computed hull below)
    f = envelope([(10.0, 0.0), (6.0, 1.0), (1.0, 9.0)])
    assert f(12.0) == 0.0 and f(10.0) == 0.0
    assert f(8.0) == pytest.approx(0.5)             # half way from none to selective
    assert f(6.0) == pytest.approx(1.0)
    assert f(3.5) == pytest.approx(5.0)             # half way from selective to full: (1 + 9) / 2
    assert f(0.5) is None                           # below the smallest stash: nothing fits


def test_memory_aware_bound_is_below_every_exact_time():
    """The memory-aware bound (the recomputation memory forces, optimizer offload allowed for) on a
    model that needs recomputation and host offload at many configurations: never above the exact
    step time, infinite only where nothing fits, and close to it somewhere (it bites)."""
    import importlib
    import math

    from sapp.api import capture_graph, tp_search_fn
    from sapp.search.joint.memory_bound import stage_time_floor
    from sapp.search.joint.placement import host_offload_possible
    g, _ = capture_graph(importlib.import_module("sapp.models").get("gpt3-1.3b"))
    c = Cluster.parse("a100-80g:nodes=2")
    ctx = SearchContext(g, c, 256, Constraints.from_dict(None), CostSettings(precision=c.precision), tp_search_fn())
    tight, checked = 0.0, 0
    for cfg in enumerate_configs(ctx)[::2]:
        prof = ctx.profile(cfg.dp_cp, cfg.tp, cfg.sp)
        floor = stage_time_floor(ctx, cfg, prof, host_offload_possible(ctx, cfg, prof))
        res = evaluate_config(ctx, cfg, prof)
        if res is None:
            continue
        checked += 1
        assert floor is not None and floor < math.inf, cfg.describe()
        lb = profile_bound(ctx, cfg, prof, floor)
        assert lb <= res.step_time_s * (1 + 1e-9), cfg.describe()
        tight = max(tight, lb / res.step_time_s)
    assert checked > 300 and tight > 0.99
