"""Llama 3's interleaved layout ("The Llama 3 Herd of Models" section 3.3.2: the first model chunk on the
first stage holds only the embedding, the last chunk on the last stage only the output projection and
loss) and the interleaved last stage's head + loss stash, held for one micro-batch: checked by hand and
against torch's interleaved order walked op by op."""
import json

import pytest

import sapp
import sapp.models as models
from sapp.api import capture_graph
from sapp.cluster import Cluster
from sapp.costmodel import CostSettings
from sapp.emit.checks import plan as checks
from sapp.errors import PlanError
from sapp.plan import Plan
from sapp.pipeline.partition import chunk_counts, interleaved_layout, partition_counts, stage_kmins
from sapp.pipeline.schedule import _orders
from sapp.search.joint import joint_search


def test_glue_chunks_by_hand():
    # 126 blocks, 16 stages of 8 chunks: 7 + 14 x 8 + 7, one block per chunk, the ends' glue alone
    assert stage_kmins(126, 16, 8) == [7] + [8] * 14 + [7]
    assert stage_kmins(128, 16, 8) == [8] * 16 and stage_kmins(125, 16, 8) is None
    assert stage_kmins(126, 16, 8, epilogue=False) is None            # no head to fill the last chunk
    assert stage_kmins(127, 16, 8, epilogue=False) == [7] + [8] * 15
    assert chunk_counts(7, 8, "first") == [0] + [1] * 7 and chunk_counts(7, 8, "last") == [1] * 7 + [0]
    assert chunk_counts(5, 4, "first") == chunk_counts(5, 4) == [1, 2, 1, 1]    # k >= v: as before
    with pytest.raises(ValueError):
        chunk_counts(7, 8)                          # a middle stage has no glue to fill a chunk
    lay = interleaved_layout([1, 2, 1], 2)          # virtual stage c * p + i is chunk c of device i
    assert lay == [(0, 0, 0), (1, 0, 1), (2, 0, 1), (0, 1, 1), (1, 1, 1), (2, 1, 0)]
    # per-stage minima in the exact count partition: stage times glue + k, glue 2 on the first stage
    seg = lambda i, k: ({0: 2.0, 2: 1.0}.get(i, 0.0) + k, True)  # noqa: E731
    assert partition_counts(5, 3, seg, kmin=[1, 2, 1]) == ([1, 2, 2], 3.0)


def _tiny(layers=6):
    m = models.get("gpt-tiny", device="meta", dropout=0.0, l=layers)
    return m, capture_graph(m)[0]


def test_pinned_v_beyond_the_blocks_per_stage_prices_llama3s_layout():
    m, g = _tiny(6)
    pins = {"pp": 2, "virtual_chunks": 4, "micro_batches": 4, "recompute": "none"}
    cl = Cluster.parse("cpu:gpus=2")
    res = joint_search(g, cl, global_batch=8, constraints=pins, settings=CostSettings())
    first, last = res.stages
    assert (first.chunks, last.chunks) == ([0, 1, 1, 1], [1, 1, 1, 0])
    # the glue-only chunk takes the glue's time, each other chunk one block's
    assert sum(first.chunk_shares) == pytest.approx(1.0) and sum(last.chunk_shares) == pytest.approx(1.0)
    assert first.chunk_shares[1] == pytest.approx(first.chunk_shares[3])
    plan = sapp.search(m, "cpu:gpus=2", global_batch=8, graph=g, constraints=pins)
    st = sorted(plan["pipeline"]["stages"], key=lambda s: s["index"])
    assert [len(s["blocks"]) for s in st] == [0, 1, 1, 1, 1, 1, 1, 0]
    assert any("Llama 3's interleaved layout" in n for n in plan["notes"])
    # emitted: the blockless first chunk is cut before layers.0, the last before the head's first
    # module (the run itself: tests/test_interleave_emit.py, case glue-v4)
    checks.check_pipeline(plan)
    assert checks.split_points(plan) == [f"layers.{i}" for i in range(6)] + ["ln_f"]
    bad = json.loads(plan.to_json())
    bad["pipeline"]["stages"][3]["blocks"] = []
    with pytest.raises(PlanError, match="in the middle of the model with no block"):
        checks.check_pipeline(Plan(bad))


def test_interleaved_last_stage_holds_its_head_and_loss_once():
    """Walk torch's interleaved order on the last device, adding each chunk's stash at its forward and
    freeing it at its backward: the peak is the priced activations.  The head + loss sit in the last
    chunk, whose forwards are each followed by their backward: they count once, not at the stage's
    average micro-batches in flight (before: (v-1) * m / rounds / v + 1/v of them)."""
    _, g = _tiny(8)
    p, v, m = 2, 2, 4
    pins = {"pp": p, "virtual_chunks": v, "micro_batches": m, "recompute": "none", "schedule": "interleaved"}
    res = joint_search(g, Cluster.parse("cpu:gpus=2"), global_batch=8, constraints=pins, settings=CostSettings())
    prof, last = res.profile, res.stages[-1]
    acts = {u.name: u.at(res.config.mbs, res.config.zero)[2][0] for u in prof.units}
    kind = {u.name: u.kind for u in prof.units}
    block = acts[last.blocks[0]]
    glue = sum(acts[n] for n in last.units if kind[n] != "block")
    assert glue > 0 and all(acts[b] == block for b in last.blocks) and last.chunks == [2, 2]
    chunk = [n * block for n in last.chunks]
    chunk[-1] += glue                                  # the head and loss: the model's last virtual stage
    held = peak = 0.0
    for kind, _, c in _orders("interleaved", p, m, v)[p - 1]:
        held += chunk[c] if kind == "fwd" else -chunk[c]
        peak = max(peak, held)
    assert last.memory["activations"] == pytest.approx(peak, rel=1e-9)


def test_unequal_chunks_in_flight_follow_torchs_order():
    """A device's stash at its peak: each chunk's live forwards weighed by its blocks, walked over
    torch's interleaved order (schedule.chunk_peak).  Equal chunks give in_flight's (warm-up + 1) / v."""
    from sapp.pipeline.schedule import chunk_in_flight, chunk_peak, in_flight
    for p, m, v in ((2, 4, 2), (4, 8, 3), (3, 6, 2), (4, 4, 4)):
        ref = in_flight("interleaved", p, m, v)
        assert [chunk_in_flight(p, m, v, i, [2] * v) for i in range(p)] == pytest.approx(ref)
    # Llama 3's layout, p 2, m 4, v 2 (torch's order by hand: device 0 runs 4 forwards before its first
    # backward, device 1 two of chunk 0, then chunk 1's forwards each followed by their backward):
    # device 0's embedding-only chunk holds nothing, so 2 block-forwards at its peak (the flat count
    # said 2.5); device 1 holds chunk 0's block 3 times (flat: 1.5), its head chunk already through
    # two backwards then (its FSDP2 accumulators alive), chunk 0 through none
    assert chunk_peak(2, 4, 2, 0, (0, 1)) == (2.0, (False, False))
    assert chunk_peak(2, 4, 2, 1, (1, 0)) == (3.0, (False, True))
    assert in_flight("interleaved", 2, 4, 2) == [2.5, 1.5]
    # m 2: device 1's peak (both chunk-0 forwards) comes before any backward
    assert chunk_peak(2, 2, 2, 1, (1, 0)) == (2.0, (False, False))
