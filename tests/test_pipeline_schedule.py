"""Pipeline schedule simulator vs the closed forms (REFERENCE section 2)."""
import itertools
import random

import pytest

from sapp.pipeline.schedule import in_flight, interleave_rounds, simulate, stage_totals, step_time


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 1), (1, 5), (2, 1), (4, 2), (4, 8), (8, 8), (3, 10)])
def test_uniform_stages_take_m_plus_p_minus_1_steps(schedule, p, m):
    tf, tb = 1.25, 2.5
    r = simulate([tf] * p, [tb] * p, m, schedule)
    assert r.step_s == pytest.approx((m + p - 1) * (tf + tb), rel=1e-12)
    assert step_time([tf] * p, [tb] * p, m, schedule) == pytest.approx(r.step_s, rel=1e-12)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (8, 3), (2, 6)])
def test_in_flight_gpipe_m_and_1f1b_p_minus_i(p, m):
    g = simulate([1.0] * p, [2.0] * p, m, "gpipe")
    o = simulate([1.0] * p, [2.0] * p, m, "1f1b")
    assert g.in_flight == [m] * p
    assert o.in_flight == [min(p - i, m) for i in range(p)]
    assert in_flight("gpipe", p, m) == g.in_flight
    assert in_flight("1f1b", p, m) == o.in_flight


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 4, 4), (2, 4, 2), (4, 12, 2), (8, 16, 2)])
def test_interleaved_bubble_is_p_minus_1_over_v_m(p, m, v):
    tf, tb = 1.0, 2.0
    r = simulate([tf] * p, [tb] * p, m, "interleaved", v=v)
    ideal = m * (tf + tb)
    assert (r.step_s - ideal) / ideal == pytest.approx((p - 1) / (v * m), rel=1e-9)
    assert r.in_flight == pytest.approx(in_flight("interleaved", p, m, v))
    assert step_time([tf] * p, [tb] * p, m, "interleaved", v) == pytest.approx(r.step_s, rel=1e-12)


def test_interleaved_sends_v_times_the_p2p_traffic():
    p, m, v = 4, 8, 2
    plain = simulate([1.0] * p, [2.0] * p, m, "1f1b", p2p_s=0.01)
    inter = simulate([1.0] * p, [2.0] * p, m, "interleaved", v=v, p2p_s=0.01)
    n_plain = sum(1 for e in plain.events if e.kind == "comm")
    n_inter = sum(1 for e in inter.events if e.kind == "comm")
    assert n_plain == 2 * (p - 1) * m
    assert n_inter == 2 * (p * v - 1) * m
    assert stage_totals([1.0] * p, [2.0] * p, 0.01, v=2)[1] == pytest.approx(3.0 + 4 * 0.01)


def test_events_do_not_overlap_on_a_stage_and_respect_dependencies():
    rnd = random.Random(3)
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
        p, m = 4, 8
        tf = [rnd.uniform(0.5, 1.5) for _ in range(p)]
        tb = [2 * x for x in tf]
        rec = [0.3 * x for x in tf]
        r = simulate(tf, tb, m, schedule, v=v, p2p_s=0.05, recompute_s=rec)
        for i in range(p):
            ev = sorted((e for e in r.events if e.stage == i), key=lambda e: e.start)
            for a, b in zip(ev, ev[1:]):
                assert b.start >= a.end - 1e-12
        fwd_end = {(e.stage, e.chunk, e.mb): e.end for e in r.events if e.kind == "fwd"}
        for e in r.events:
            if e.kind == "bwd":
                assert e.start >= fwd_end[(e.stage, e.chunk, e.mb)]
        assert any(e.kind == "recompute" for e in r.events)
        assert r.step_s == pytest.approx(max(e.end for e in r.events))


def test_closed_form_bounds_nonuniform_simulation():
    rnd = random.Random(7)
    for _, schedule in itertools.product(range(20), ("gpipe", "1f1b")):
        p, m = rnd.randint(2, 6), rnd.randint(1, 12)
        tf = [rnd.uniform(0.2, 2) for _ in range(p)]
        tb = [rnd.uniform(0.4, 4) for _ in range(p)]
        sim = simulate(tf, tb, m, schedule).step_s
        T = [a + b for a, b in zip(tf, tb)]
        assert sim >= m * max(T) - 1e-9            # the slowest stage is busy m times
        # forward and backward waves each take at most (m - 1) x their slowest stage + the sum
        assert sim <= (m - 1) * (max(tf) + max(tb)) + sum(T) + 1e-9
        if schedule == "gpipe":
            assert sim == pytest.approx((m - 1) * (max(tf) + max(tb)) + sum(T))
    # proportional stages (tb = 2 tf, as the cost model gives): the closed form is exact for GPipe
    for _ in range(10):
        p, m = rnd.randint(2, 6), rnd.randint(1, 12)
        tf = [rnd.uniform(0.2, 2) for _ in range(p)]
        tb = [2 * x for x in tf]
        assert simulate(tf, tb, m, "gpipe").step_s == pytest.approx(step_time(tf, tb, m, "gpipe"))


def test_interleaved_refuses_what_torch_refuses():
    # torch's flex interleaving: rounds = max(1, m // p), m a multiple of it (7 over 3: rounds 2)
    with pytest.raises(ValueError):
        simulate([1.0] * 3, [2.0] * 3, 7, "interleaved", v=2)
    with pytest.raises(ValueError):
        in_flight("interleaved", 3, 7, 2)
    assert interleave_rounds(4, 6) == (1, 6) and interleave_rounds(4, 10) == (2, 5)
    assert interleave_rounds(3, 7) is None


def _torch_order(p, m, v, rank):
    """torch 2.13's own per-rank compute order for ScheduleInterleaved1F1B, built without processes."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B
    s = ScheduleInterleaved1F1B.__new__(ScheduleInterleaved1F1B)
    s.pp_group_size, s.n_local_stages, s._n_microbatches = p, v, m
    s.number_of_rounds = max(1, m // p)
    s.microbatches_per_round = m // s.number_of_rounds
    out = []
    for a in s._calculate_single_rank_operations(rank):
        if a is not None:
            kind = "fwd" if str(a.computation_type).endswith("F") or "FORWARD" in str(a.computation_type) else "bwd"
            out.append((kind, a.microbatch_index, a.stage_index // p))
    return out


@pytest.mark.parametrize("p,m,v", [(2, 4, 3), (4, 8, 2), (4, 6, 3), (4, 10, 2), (3, 3, 4), (3, 5, 2), (4, 4, 5)])
def test_interleaved_order_is_torchs(p, m, v):
    from sapp.pipeline.schedule import _orders
    ours = _orders("interleaved", p, m, v)
    for rank in range(p):
        assert ours[rank] == _torch_order(p, m, v, rank)


@pytest.mark.parametrize("p,m,v", [(4, 6, 2), (3, 4, 3), (2, 3, 3), (4, 10, 2)])
def test_flex_interleaving_uniform_stages(p, m, v):
    """m not a multiple of p: no closed form; the step is at least m x the stage's work and the
    first forward of the last micro-batch cannot start before the warm-up, and step_time says the
    simulator's figure.  Hand check for (2, 3, 3) below."""
    tf, tb = 1.0, 2.0
    r = simulate([tf] * p, [tb] * p, m, "interleaved", v=v)
    assert r.step_s >= m * (tf + tb) + (p - 1) * (tf + tb) / v - 1e-9
    assert step_time([tf] * p, [tb] * p, m, "interleaved", v) == r.step_s


def test_flex_interleaving_warmup_is_torchs():
    # p=2, m=3, v=3: one round of 3 micro-batches; torch warms rank 0 up with (v-1)*3 + 2 = 8
    # forwards and rank 1 with 6, so 9 and 7 chunks are held at the peak (stage units: /3)
    r = simulate([3.0, 3.0], [6.0, 6.0], 3, "interleaved", v=3)
    assert r.step_s >= 3 * 9.0
    assert r.in_flight == [9 / 3, 7 / 3]


def test_unequal_chunks_price_the_longer_chunk():
    """Chunks of different sizes (a stage of 3 blocks in 2 chunks: 1/3 and 2/3) are slower than equal
    ones with the same stage totals (the longer chunk sets the steady-state beat) and step_time
    follows the simulator there."""
    p, m, v = 2, 4, 2
    eq = simulate([3.0] * p, [6.0] * p, m, "interleaved", v=v).step_s
    sh = [[1 / 3, 2 / 3]] * p
    un = simulate([3.0] * p, [6.0] * p, m, "interleaved", v=v, chunk_shares=sh).step_s
    assert un > eq
    assert step_time([3.0] * p, [6.0] * p, m, "interleaved", v, chunk_shares=sh) == un
    assert step_time([3.0] * p, [6.0] * p, m, "interleaved", v, chunk_shares=[[0.5, 0.5]] * p) == pytest.approx(eq)


def test_accumulation_without_a_pipeline_holds_one_micro_batch():
    # schedule "none" (pp = 1, m micro-batches) runs each forward + backward before the next
    assert in_flight("none", 1, 64) == [1.0]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_forward_and_backward_sends_priced_apart(schedule):
    """A boundary whose forward carries a tensor without gradient (a mask built from an input) sends
    more forward than backward: each send is charged at its own cost (per stage where cuts differ) in
    the simulator and in the closed form's stage totals; one number prices both alike, as before."""
    p, m = 4, 6
    tf, tb = [1.0, 1.2, 0.9, 1.1], [2.0, 2.1, 1.9, 2.2]
    assert step_time(tf, tb, m, schedule, p2p_s=(0.05, 0.05)) == step_time(tf, tb, m, schedule, p2p_s=0.05)
    assert simulate(tf, tb, m, schedule, p2p_s=(0.05, 0.05)).step_s == simulate(tf, tb, m, schedule, p2p_s=0.05).step_s
    for sends in ((0.08, 0.03), [(0.08, 0.03), (0.02, 0.05), (0.07, 0.01), (0.0, 0.04)]):
        per = sends if isinstance(sends, list) else [sends] * p
        own = [(i < p - 1) * f + (i > 0) * b for i, (f, b) in enumerate(per)]
        sim = simulate(tf, tb, m, schedule, p2p_s=sends)
        comm = [sum(e.end - e.start for e in sim.events if e.kind == "comm" and e.stage == i) for i in range(p)]
        assert comm == pytest.approx([m * x for x in own])
        assert stage_totals(tf, tb, sends) == pytest.approx([f + b + x for f, b, x in zip(tf, tb, own)])
