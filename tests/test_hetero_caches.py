"""The caches one device group's searches share across its batch shares (sapp/search/hetero.py's
GroupPricer, joint_search(caches=...), joint.context._shared, pipeline/profile.py's sampled
numbers): a search with caches warmed at other batches builds the same plan, byte for byte, as a
fresh one.  The sparse-table model is the case where the largest micro-batch reaches the numbers
(a sparse table's gradient grows with the samples a rank takes in a step): there the cached
samples are kept per that size, and a stale one would change the plan."""
import json

import pytest

from sapp.cluster import Cluster
from sapp.errors import SappError


def _plan(graph, cluster, batch, settings, fn, caches=None):
    from sapp.api import build_plan
    from sapp.search.constraints import Constraints
    from sapp.search.joint import joint_search
    cons = Constraints.from_dict(None)
    res = joint_search(graph, cluster, global_batch=batch, constraints=cons, settings=settings, search_fn=fn,
                       caches=caches)
    plan = build_plan(graph, cluster, res, name="t", global_batch=batch, constraints=cons, settings=settings)
    return json.dumps(plan.to_dict(), sort_keys=True), res


@pytest.mark.parametrize("model, spec, batches", [
    ("gpt3-125m", "a100-80g:nodes=1", (64, 16, 40, 64)),
    ("wide-deep-tiny", "a100-80g:nodes=1,gpus=4", (256, 64, 1024, 64)),
])
def test_warm_caches_build_the_fresh_plan(model, spec, batches):
    from sapp.api import capture_spec, tp_search_fn
    from sapp.costmodel import CostSettings
    graph = capture_spec(model)[3]
    cluster, settings, fn = Cluster.parse(spec), CostSettings(), tp_search_fn()
    caches = {}
    for b in batches:           # (the last batch again: every entry then comes from the caches)
        warm, _ = _plan(graph, cluster, b, settings, fn, caches)
        fresh, _ = _plan(graph, cluster, b, settings, fn)
        assert warm == fresh, f"{model} at batch {b}: a cached entry changed the plan"
    assert any(k[0] == "sample" for k in caches["graph"] if isinstance(k, tuple))


def test_sparse_numbers_are_kept_per_largest_micro_batch():
    """The sparse table's gradient sync read from the cache is the one for this batch's step."""
    from sapp.api import capture_spec, tp_search_fn
    from sapp.costmodel import CostSettings
    graph = capture_spec("wide-deep-tiny")[3]
    cluster, settings, fn = Cluster.parse("a100-80g:nodes=1,gpus=4"), CostSettings(), tp_search_fn()
    caches = {}
    _plan(graph, cluster, 64, settings, fn, caches)
    _, warm = _plan(graph, cluster, 1024, settings, fn, caches)
    _, fresh = _plan(graph, cluster, 1024, settings, fn)
    assert warm.step_time_s == fresh.step_time_s and warm.peak_memory_bytes == fresh.peak_memory_bytes


def test_caches_refuse_another_cluster_or_settings():
    from sapp.api import capture_spec, tp_search_fn
    from sapp.costmodel import CostSettings
    graph = capture_spec("gpt3-125m")[3]
    fn, caches = tp_search_fn(), {}
    _plan(graph, Cluster.parse("a100-80g:nodes=1"), 16, CostSettings(), fn, caches)
    with pytest.raises(SappError, match="shared search caches"):
        _plan(graph, Cluster.parse("h100-80g:nodes=1"), 16, CostSettings(), fn, caches)
    with pytest.raises(SappError, match="shared search caches"):
        _plan(graph, Cluster.parse("a100-80g:nodes=1"), 16, CostSettings(precision="fp32"), fn, caches)


def test_group_pricer_shares_one_cache_per_group():
    from sapp.api import capture_spec, tp_search_fn
    from sapp.cluster.groups import parse
    from sapp.search.constraints import Constraints
    from sapp.costmodel import CostSettings
    from sapp.search.hetero import GroupPricer
    graph = capture_spec("gpt3-125m")[3]
    mc = parse("a100-80g:nodes=1+h100-80g:nodes=1")
    pr = GroupPricer(graph, mc, Constraints.from_dict(None), CostSettings(), tp_search_fn())
    for b in (8, 16):
        pr.result(0, b)
        pr.result(1, b)
    a, h = pr.shared
    assert a["for"][1] is mc.groups[0] and h["for"][1] is mc.groups[1]
    # the tp layouts searched once per group and degree, whatever the number of shares
    assert sorted(k for k in a["strategies"] if k[0] == "tp") == [("tp", 2), ("tp", 4), ("tp", 8)]
