"""Context parallelism priced (sapp/costmodel/context.py) and searched (sapp/search/joint/cp.py):
hand-counted causal work, alpha-beta exchange times, the K/V bytes read off the captured graph, the
gathered K/V a CP plan keeps, the enumeration's cp degrees, the plan field and its round trip."""
import pytest

import sapp
from sapp.cluster import Cluster
from sapp.costmodel import CostSettings
from sapp.costmodel import context as C
from sapp.errors import ConstraintError, PlanError
from sapp.plan import Plan


def test_balanced_chunks_by_hand():
    assert C.chunk_positions(8, 2, 0) == [0, 1, 6, 7]
    assert C.chunk_positions(8, 2, 1) == [2, 3, 4, 5]
    # causal pairs: query at position p sees p + 1 keys; rank 0: 1+2+7+8 = 18 of 36, rank 1: 3+4+5+6 = 18
    assert C.causal_pairs(C.chunk_positions(8, 2, 0)) == 18
    assert C.causal_pairs_share(8, 2, 1) == pytest.approx(0.5)
    # contiguous halves: rank 1 holds 5+6+7+8 = 26 of the 36 pairs
    assert C.causal_pairs_share(8, 2, 1, balanced=False) == pytest.approx(26 / 36)


@pytest.mark.parametrize("seq,cp", [(32, 2), (64, 4), (131072, 16), (96, 3)])
def test_balanced_share_is_one_over_cp(seq, cp):
    shares = [C.causal_pairs_share(seq, cp, r) for r in range(cp)]
    assert all(s == pytest.approx(1 / cp, rel=1e-12) for s in shares)
    assert sum(C.causal_pairs_share(seq, cp, r) for r in range(cp)) == pytest.approx(1.0)
    assert C.worst_rank_share(seq, cp, balanced=False) > 1 / cp


def test_kv_exchange_alpha_beta_by_hand():
    cl = Cluster.parse("h100-80g:nodes=4")
    a, b = cl.intra_latency, cl.intra_bw
    f, g = C.kv_exchange_time(64e6, 4, "intra", cl)
    # ring all-gather of a 64 MB output over 4 ranks: 3 alpha + 3/4 of the bytes over the link
    assert f == pytest.approx(3 * a + 0.75 * 64e6 / b, rel=1e-6)
    assert g == pytest.approx(f, rel=1e-6)          # reduce-scatter of the same bytes
    assert C.kv_exchange_time(64e6, 1, "intra", cl) == (0.0, 0.0)
    assert C.cp_link(2, 4, 8) == "intra" and C.cp_link(4, 4, 8) == "inter"
    assert C.kv_saved_bytes(100.0, 4) == pytest.approx(75.0)
    assert C.check_sequence(32, 4) and not C.check_sequence(32, 3)


def _graph():
    import sapp.models as models
    from sapp.api import capture_graph
    g, _ = capture_graph(models.get("gpt-tiny"))
    return g


def test_kv_bytes_from_the_graph():
    from sapp.search.joint import cp
    g = _graph()
    assert cp.sequence_length(g) == 32 and cp.admits_cp(g)
    names = g.blocks["layers.0"]
    # K and V of one whole sample: 2 x seq 32 x h 64 x 4 B (fp32)
    assert cp.kv_bytes_per_sample(g, names, {}, None, 1, CostSettings("fp32")) == 2 * 32 * 64 * 4
    # cp degrees: divisors of the devices that split 32 tokens into 2 cp chunks
    assert cp.cp_degrees(g, 64) == [1, 2, 4, 8, 16]


def test_enumeration_keeps_only_cp_configs_plain_dp_cannot_make():
    from sapp.search.constraints import Constraints
    from sapp.search.joint.configs import enumerate_configs
    from sapp.search.joint.context import SearchContext
    g = _graph()
    cl = Cluster.parse("cpu:gpus=2")
    ctx = SearchContext(g, cl, 4, Constraints(tp=1), CostSettings("fp32"), None)
    cps = sorted((c.dp, c.cp, c.m, c.mbs) for c in enumerate_configs(ctx) if c.cp > 1 and c.zero == 0)
    # dp=1 cp=2 over 4 samples: micro-batches of 4 or 2 samples are dp=2 runs at 2 or 1 samples
    # with the same tokens per rank and no K/V exchange: only mbs=1 is left
    assert cps == [(1, 2, 4, 1)]
    ctx1 = SearchContext(g, cl, 1, Constraints(tp=1), CostSettings("fp32"), None)
    assert any(c.cp == 2 for c in enumerate_configs(ctx1))       # one sample: only cp uses both devices


def _plans():
    g = _graph()
    pins = {"tp": 1, "pp": 1, "zero": 0, "micro_batches": 1, "recompute": "none"}
    cp2 = sapp.search("gpt-tiny", "cpu:gpus=2", global_batch=4, graph=g, constraints=dict(pins, cp=2, dp=1))
    dp2 = sapp.search("gpt-tiny", "cpu:gpus=2", global_batch=4, graph=g, constraints=dict(pins, cp=1, dp=2))
    return g, cp2, dp2


def test_cp_plan_memory_and_round_trip():
    g, cp2, dp2 = _plans()
    assert cp2["parallel"] == {"dp": 1, "tp": 1, "pp": 1, "cp": 2} and "cp" not in dp2["parallel"]
    # same tokens per rank (4 samples x 16 tokens vs 2 x 32): activations differ by the gathered
    # K/V kept beside: 2 layers x (cp-1)/cp x 4 samples x 2 x 32 x 64 x 4 B
    width = 4 if cp2["settings"]["precision"] == "fp32" else 2
    extra = 2 * 0.5 * 4 * 2 * 32 * 64 * width
    da = cp2["predicted"]["memory"]["activations"] - dp2["predicted"]["memory"]["activations"]
    assert da == pytest.approx(extra, rel=1e-6)
    assert any("context parallel cp=2" in n for n in cp2["notes"])
    from sapp.report import explain
    assert "cp=2" in explain(cp2)
    again = Plan(cp2.to_dict())
    r = sapp.evaluate("gpt-tiny", "cpu:gpus=2", again, graph=g)
    assert r["step_time_s"] == pytest.approx(cp2["predicted"]["step_time_s"], rel=1e-5)   # plans keep 6 digits
    assert "cp=2" in r["config"]


def test_plan_field_validation():
    g, cp2, dp2 = _plans()
    d = cp2.to_dict()
    d["parallel"]["cp"] = 4               # 1 x 1 x 1 x 4 != 2 devices
    with pytest.raises(PlanError, match="cp"):
        Plan(d)
    d["parallel"]["cp"] = 0
    with pytest.raises(PlanError):
        Plan(d)
    old = dp2.to_dict()                   # a plan from before cp: no field, loads as cp = 1
    assert "cp" not in old["parallel"] and Plan(old).parallel.get("cp", 1) == 1


def test_cp_must_split_the_sequence():
    g = _graph()
    with pytest.raises(ConstraintError):
        sapp.search("gpt-tiny", "cpu:gpus=3", global_batch=3, graph=g, constraints={"cp": 3, "tp": 1, "pp": 1})
