"""The joint search's memoised work returns what the plain computation returns, bit for bit: the
cost evaluation with a memo shared between layouts of one mesh, a profile reusing an earlier
profile's numbers (its copies not shared), the memory envelope with its spans precomputed."""
import dataclasses
import random

from bench.random_graphs import gpt_graph
from sapp.cluster import Cluster
from sapp.costmodel import CostSettings, evaluate_sharding
from sapp.pipeline import profile as P
from sapp.search.joint.memory_bound import envelope

CL = Cluster.parse("a100-80g:nodes=1")


def _graph():
    return gpt_graph(layers=2, b=2, s=128, h=256, a=4, vocab=1024)


def test_memoised_evaluation_equals_plain():
    """The sp and plain layouts of one (dp, tp) mesh evaluated through one memo (the second reuses the
    first's node / edge / saved-item prices where its strategies agree) equal evaluations without."""
    g, st = _graph(), CostSettings()
    plain = P.build_profile(g, CL, st, 2, 2)
    sp = P.build_profile(g, CL, st, 2, 2, sp=True)
    assert plain.strategies != sp.strategies          # the SP layout differs somewhere: a real test
    memo = {}
    for prof in (plain, sp, plain):
        for acts in (True, False):
            got = evaluate_sharding(prof.template, prof.strategies, prof.mesh, CL, st, activations=acts,
                                    totals=False, memo=memo)
            want = evaluate_sharding(prof.template, prof.strategies, prof.mesh, CL, st, activations=acts,
                                     totals=False)
            assert got.per_node == want.per_node


def _numbers(prof):
    return [(u.name, u.fwd, u.bwd, u.act, u.extra, u.out_bytes, u.zfwd, u.zbwd, u.grad_sync, u.sync_lat, u.states,
             u.flops, u.tensors, u.side) for u in prof.units]


def test_profile_reusing_numbers_equals_a_fresh_one():
    """tp = 1 with sp asked has the plain layout: built after the plain profile in one search's cache it
    reuses its numbers, and they equal a profile built alone; its units' states are its own copies."""
    g, st = _graph(), CostSettings()
    gc, units = {}, P.split_units(g)
    first = P.build_profile(g, CL, st, 4, 1, units=units, graph_cache=gc, max_mbs=16)
    again = P.build_profile(g, CL, st, 4, 1, units=units, graph_cache=gc, max_mbs=16, sp=True)
    alone = P.build_profile(g, CL, st, 4, 1, max_mbs=16, sp=True)
    assert any(k[0] == "numbers" for k in gc)
    assert _numbers(again) == _numbers(alone) == _numbers(first)
    again.units[1].states[0]["params"] += 1.0
    assert first.units[1].states[0]["params"] == alone.units[1].states[0]["params"]


def _plain_envelope(points):
    pts = sorted(set(points))

    def f(y):
        best = None
        for i, (a1, e1) in enumerate(pts):
            if a1 <= y:
                best = e1 if best is None else min(best, e1)
            for a2, e2 in pts[i + 1:]:
                if a1 <= y <= a2 and a2 > a1:
                    e = e2 + (e1 - e2) * (a2 - y) / (a2 - a1)
                    best = e if best is None else min(best, e)
        return best
    return f


def test_envelope_equals_the_plain_double_loop():
    rng = random.Random(7)
    for _ in range(3000):
        pts = [(rng.choice([0.0, 1.0, 2.0, rng.random() * 10]), rng.choice([0.0, -0.0, rng.random()]))
               for _ in range(rng.randint(1, 4))]
        f, g = envelope(pts), _plain_envelope(pts)
        for y in [rng.random() * 12 - 1 for _ in range(4)] + [a for a, _ in pts]:
            assert repr(f(y)) == repr(g(y))


def test_profile_numbers_unchanged_by_settings_copy():
    """The reuse key holds the settings: another precision is priced anew, not taken from the cache."""
    g, gc, units = _graph(), {}, None
    units = P.split_units(g)
    a = P.build_profile(g, CL, CostSettings(), 2, 1, units=units, graph_cache=gc)
    b = P.build_profile(g, CL, dataclasses.replace(CostSettings(), precision="fp32"), 2, 1, units=units,
                        graph_cache=gc)
    assert _numbers(a) != _numbers(b)
