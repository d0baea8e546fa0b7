"""The bounded exact partition of non-uniform models (sapp/search/joint/partition_bound.py) against
the plain O(p n^2) program (`pipeline.partition.partition_dp`, checked against brute force in
tests/test_pipeline_partition.py): the same stage starts, infeasible where it is infeasible, on a
tiny DeepSeek-like model (2 dense + 6 MoE blocks) over every pipelined configuration of a search, at
memory capacities from roomy to below what fits, with free and forced recompute policies."""
import pytest

import sapp.models as zoo
from sapp.capture import capture
from sapp.cluster import Cluster
from sapp.search.constraints import Constraints
from sapp.costmodel import CostSettings
from sapp.pipeline.partition import partition_dp
from sapp.search.joint import SearchContext, enumerate_configs
from sapp.search.joint.partition_bound import partition_bounded
from sapp.search.joint.memory_bound import memory_needed
from sapp.search.joint.stage import StageEvaluator


@pytest.fixture(scope="module")
def ctx():
    g = capture(zoo.get("moe-tiny", l=8, dense=2), batch=8)
    cl = Cluster.parse("a100-80g:devices=16")
    return SearchContext(g, cl, 64, Constraints.from_dict(None), CostSettings(precision=cl.precision), None)


def _cuts(ev):
    cut = [u.cut_before for u in ev.units]
    return [True] + cut[1:]


def test_model_is_non_uniform(ctx):
    assert not ctx.uniform          # the search takes the dynamic program for it, not the count bisection


@pytest.mark.parametrize("policy", [None, "selective"])
def test_same_starts_as_the_plain_program(ctx, policy):
    from sapp.search.joint.interleave import mixed_chunked
    # (the chunked schedules over blocks of several types are dealt per device, no contiguous partition)
    cfgs = [c for c in enumerate_configs(ctx) if c.pp > 1 and not mixed_chunked(ctx, c)]
    assert len(cfgs) >= 10
    seen = {"feasible": 0, "infeasible": 0}
    priced = {"plain": 0, "bounded": 0}
    for cfg in cfgs:
        prof = ctx.profile(cfg.dp_cp, cfg.tp, cfg.sp)
        need = memory_needed(ctx, cfg, prof)
        # roomy, and capacities around the least that fits (recomputation and infeasibility)
        for cap in (ctx.cap, need * 1.3, need, need * 0.8, need * 0.5):
            ref_ev = StageEvaluator(ctx, cfg, prof, policy, cap - ctx.cap)
            ev = StageEvaluator(ctx, cfg, prof, policy, cap - ctx.cap)
            n = ref_ev.n
            ref, _ = partition_dp(n, cfg.pp, _cuts(ref_ev), ref_ev.seg)
            got = partition_bounded(ev, n, cfg.pp, _cuts(ev))
            assert got == ref, (cfg.describe(), cap)
            seen["infeasible" if ref is None else "feasible"] += 1
            priced["plain"] += len(ref_ev.cache)
            priced["bounded"] += len(ev.cache)
    assert seen["feasible"] > 0 and seen["infeasible"] > 0
    assert priced["bounded"] < priced["plain"]          # the point: fewer segments priced
