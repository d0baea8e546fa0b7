"""FSDP2's ZeRO-3 all-gather prefetch, priced as what FSDP2 overlaps (sapp.costmodel.gradsync
fsdp_prefetch_hidden, applied per stage by sapp/search/joint/numbers.UnitNumbers and stage.seg).

A pass over units with gathers g_i and compute c_i, the gather of unit i+1 issued when unit i starts
and one unit in flight: an event simulation written here (two resources, the gather stream and the
compute stream) is the independent expectation; the pricing is the closed form.  Then a ZeRO-3
configuration on an asynchronous device: the stage's forward and backward are the units' compute plus
the simulated exposed gathers (forward in forward order, backward in reverse), the first gather of each
pass exposed whole.  The memory of the extra unit in flight: tests/test_memory_rules.py (measured)."""
from types import SimpleNamespace

import pytest

from sapp.costmodel.gradsync import fsdp_prefetch_hidden


def simulate(g, c):
    """Makespan of a pass: unit i computes once its gather is done and unit i-1 finished; the gather of
    unit i starts when the previous gather is done and unit i-1 has started (one unit prefetched)."""
    g_end, c_start, c_end = [], [], []
    for i in range(len(g)):
        gs = 0.0 if i == 0 else max(g_end[i - 1], c_start[i - 1])
        g_end.append(gs + g[i])
        cs = max(g_end[i], c_end[i - 1] if i else 0.0)
        c_start.append(cs)
        c_end.append(cs + c[i])
    return c_end[-1]


def test_hidden_gathers_by_hand():
    g, c = [3.0, 1.0, 4.0, 1.0], [2.0, 0.5, 5.0, 1.0]
    # unit 1's gather (1) fits under unit 0's compute (2); unit 2's (4) shows 3.5 beyond unit 1's 0.5;
    # unit 3's (1) under unit 2's 5; the first gather (3) exposed
    assert fsdp_prefetch_hidden(g, c) == [0.0, 1.0, 0.5, 1.0]
    exposed = sum(g) - sum(fsdp_prefetch_hidden(g, c))
    assert exposed == 3.0 + 0.0 + 3.5 + 0.0
    assert simulate(g, c) == pytest.approx(sum(c) + exposed)


@pytest.mark.parametrize("seed", range(5))
def test_closed_form_equals_the_event_simulation(seed):
    import random
    rnd = random.Random(seed)
    n = rnd.randint(1, 12)
    g = [rnd.uniform(0, 3) for _ in range(n)]
    c = [rnd.uniform(0, 3) for _ in range(n)]
    assert simulate(g, c) == pytest.approx(sum(c) + sum(g) - sum(fsdp_prefetch_hidden(g, c)), rel=1e-12)


def _search(cluster, zero, pp=1, dp=4):
    import sapp
    import sapp.models as models
    from sapp.api import capture_graph
    from sapp.search.constraints import Constraints
    from sapp.costmodel import CostSettings
    from sapp.search.joint import joint_search
    m = models.get("gpt-tiny", device="meta", dropout=0.0)
    graph, _ = capture_graph(m)
    cl = sapp.Cluster.parse(cluster)
    cons = Constraints.from_dict({"dp": dp, "tp": 1, "pp": pp, "zero": zero, "recompute": "none",
                                  "placement": {"optimizer": "device"}})
    return joint_search(graph, cl, global_batch=16, constraints=cons, settings=CostSettings())


def _expected(res):
    """Per stage (fwd, bwd) from the profile's units: ZeRO-0 curves as compute, ZeRO-3 minus ZeRO-0 as
    the gathers, passed through the simulation (backward in reverse order)."""
    cfg, prof = res.config, res.profile
    by = {u.name: u for u in prof.units}
    out = []
    for st in res.stages:
        units = [by[n] for n in st.units]
        f3 = [u.at(cfg.mbs, 3)[0] for u in units]
        f0 = [u.at(cfg.mbs, 0)[0] for u in units]
        b3 = [u.at(cfg.mbs, 3)[1] for u in units]
        b0 = [u.at(cfg.mbs, 0)[1] for u in units]
        gf = [a - b for a, b in zip(f3, f0)]
        gb = [a - b for a, b in zip(b3, b0)]
        out.append((simulate(gf, f0), simulate(gb[::-1], b0[::-1]), sum(f3), sum(b3)))
    return out


@pytest.mark.parametrize("pp", [1, 2])
def test_zero3_stage_is_compute_plus_the_exposed_gathers(pp):
    res = _search("a100-80g:nodes=1,gpus=8", zero=3, pp=pp, dp=8 // pp)
    assert res.config.zero == 3 and res.overlap == "fsdp-units"
    assert any("prefetched" in n for n in res.notes)
    for st, (fwd, bwd, whole_f, whole_b) in zip(res.stages, _expected(res)):
        assert st.fwd_s == pytest.approx(fwd, rel=1e-9)
        assert st.bwd_s - st.recompute_s == pytest.approx(bwd, rel=1e-9)
        assert fwd < whole_f and bwd < whole_b        # something was hidden


def test_serial_device_overlaps_no_gather():
    res = _search("cpu:gpus=4", zero=3)
    assert res.overlap == "none"
    (fwd, bwd, whole_f, whole_b), = _expected(res)
    assert res.stages[0].fwd_s == pytest.approx(whole_f, rel=1e-9)
    assert res.stages[0].bwd_s - res.stages[0].recompute_s == pytest.approx(whole_b, rel=1e-9)
