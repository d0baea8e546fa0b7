"""Interleaving with any v, uneven stages and the gradient-sync overlap rule: the pieces the joint
search prices, checked against hand-computed values."""
import pytest

import sapp
import sapp.models as models
from sapp.cluster import Cluster
from sapp.costmodel.gradsync import DDP_BUCKET_BYTES, exposed_grad_sync, overlap_rule
from sapp.errors import ConstraintError
from sapp.pipeline.partition import chunk_counts, interleaved_layout, partition_counts


def test_chunk_counts_put_extra_blocks_on_middle_chunks():
    assert chunk_counts(6, 3) == [2, 2, 2]
    assert chunk_counts(7, 3) == [2, 3, 2]            # the middle chunk first
    assert chunk_counts(8, 3) == [2, 3, 3]            # then the last
    assert chunk_counts(3, 2) == [1, 2]
    assert chunk_counts(5, 4) == [1, 2, 1, 1]
    with pytest.raises(ValueError):
        chunk_counts(2, 3)


def test_interleaved_layout_is_torchs_virtual_stage_order():
    # virtual stage c * p + i is chunk c of device i (ScheduleInterleaved1F1B's stage_index)
    assert interleaved_layout([4, 3], 3) == [(0, 0, 1), (1, 0, 1), (0, 1, 2), (1, 1, 1), (0, 2, 1), (1, 2, 1)]


def test_partition_gives_the_glue_stages_fewer_blocks():
    # stage times: prologue worth 2 blocks on stage 0, epilogue worth 1 on the last, 10 blocks.
    # Bottleneck 5: at most 3 + 5 + 4 blocks; the slowest stages give blocks back -> [2, 4, 4]
    glue = {0: 2.0, 2: 1.0}
    seg = lambda i, k: (glue.get(i, 0.0) + k, True)  # noqa: E731
    counts, x = partition_counts(10, 3, seg)
    assert counts == [2, 4, 4] and x == 5.0
    # interleaving with v = 3 needs >= 3 blocks per stage: [3, 4, 3], same bottleneck
    counts, x = partition_counts(10, 3, seg, kmin=3)
    assert counts == [3, 4, 3] and x == 5.0
    assert partition_counts(8, 3, seg, kmin=3) == (None, float("inf"))


def test_overlap_rule_per_cluster_and_runtime():
    gpu, cpu = Cluster.parse("a100-80g:nodes=1"), Cluster.parse("cpu:gpus=2")
    assert overlap_rule(cpu, 0, 1, 1) == "none" and overlap_rule(cpu, 3, 1, 1) == "none"
    assert overlap_rule(gpu, 0, 1, 1) == "ddp-buckets" and overlap_rule(gpu, 1, 1, 1) == "ddp-buckets"
    assert overlap_rule(gpu, 0, 1, 2) == "none" and overlap_rule(gpu, 1, 2, 1) == "none"   # flat all-reduce
    assert overlap_rule(gpu, 2, 4, 2) == "fsdp-units" and overlap_rule(gpu, 3, 1, 1) == "fsdp-units"
    # the fused runtime prices Megatron-Core, whose distributed optimizer overlaps under TP / pipelines too
    assert overlap_rule(gpu, 1, 2, 8, "fused") == "megatron-buckets" and overlap_rule(gpu, 0, 1, 2, "fused") == \
        "megatron-buckets"
    assert overlap_rule(gpu, 2, 2, 8, "fused") == "fsdp-units" and overlap_rule(cpu, 1, 2, 2, "fused") == "none"
    g = 4 * DDP_BUCKET_BYTES      # its last bucket stays exposed as DDP's does
    assert exposed_grad_sync("megatron-buckets", 1.0, 0.01, 5.0, grad_bytes=g) == pytest.approx(0.26)


def test_exposed_grad_sync_by_hand():
    # 1 s of bandwidth + 0.01 s latency, 0.6 s of backward to hide under
    assert exposed_grad_sync("none", 1.0, 0.01, 0.6) == pytest.approx(1.01)
    # FSDP2: last unit 0.1 s; 1.01 - 0.6 = 0.41 left after backward > 0.1 + 0.01
    assert exposed_grad_sync("fsdp-units", 1.0, 0.01, 0.6, last_unit_s=0.1) == pytest.approx(0.41)
    # long backward: only the last unit's reduce-scatter (and the latency) stays
    assert exposed_grad_sync("fsdp-units", 1.0, 0.01, 5.0, last_unit_s=0.1) == pytest.approx(0.11)
    # DDP: 100 MB of gradients -> the last 25 MB bucket is a quarter of the bandwidth time
    g = 4 * DDP_BUCKET_BYTES
    assert exposed_grad_sync("ddp-buckets", 1.0, 0.01, 5.0, last_unit_s=0.1, grad_bytes=g) == pytest.approx(0.26)
    # a first tensor bigger than the bucket cap is its own (last) bucket
    assert exposed_grad_sync("ddp-buckets", 1.0, 0.01, 5.0, last_unit_s=0.5, grad_bytes=g) == pytest.approx(0.51)


def _search(layers, spec, batch, pins):
    return sapp.search(models.get("gpt-tiny", device="meta", dropout=0.0, l=layers), spec, global_batch=batch,
                       constraints=pins)


def test_plans_say_which_overlap_they_priced():
    cpu = _search(2, "cpu:gpus=2", 8, {"dp": 2})
    assert cpu["settings"]["grad_sync_overlap_rule"] == "none"
    gpu = _search(2, "a100-80g:devices=2", 8, {"dp": 2, "tp": 1, "zero": 0})
    assert gpu["settings"]["grad_sync_overlap_rule"] == "ddp-buckets"
    assert any("DDP's 25 MB buckets" in n for n in gpu["notes"])


@pytest.mark.parametrize("pins,needle", [
    # 6 blocks over 2 stages of 5 chunks: even Llama 3's layout (first / last stage v - 1 blocks beside a
    # chunk of the embedding / head alone) needs 2 * 5 - 2 = 8
    ({"pp": 2, "virtual_chunks": 5}, "needs >= 8 blocks"),
    # 7 micro-batches over 3 stages: torch's rounds = 2 do not divide 7
    ({"pp": 3, "virtual_chunks": 2, "micro_batches": 7}, "multiple of max(1, m // pp)"),
])
def test_impossible_pinned_v_says_why(pins, needle):
    spec = "cpu:gpus=3" if pins["pp"] == 3 else "cpu:gpus=2"
    with pytest.raises(ConstraintError) as e:
        _search(6, spec, 14 if pins.get("micro_batches") == 7 else 8, pins)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and "relax them" not in msg


def test_pinned_v_that_does_not_divide_the_blocks_is_searched():
    # 7 blocks, v = 3 over 2 stages: 4 + 3 blocks, the first stage's chunks 1-2-1
    p = _search(7, "cpu:gpus=2", 12, {"pp": 2, "virtual_chunks": 3, "micro_batches": 4})
    st = sorted(p["pipeline"]["stages"], key=lambda s: s["index"])
    assert [len(s["blocks"]) for s in st] == [1, 1, 2, 1, 1, 1]
    assert p["pipeline"]["virtual_chunks"] == 3


def test_pinned_v_whose_rows_do_not_spread_evenly_gets_balanced_stages():
    # 12 blocks, pp 4, pinned v 2: rows of 2 blocks (6 rows over 4 stages) would give two devices 4
    # blocks and two 2; the pin prices any count >= v, so every device holds 3 (chunks 1 + 2)
    p = _search(12, "a100-80g:devices=4", 8, {"pp": 4, "virtual_chunks": 2, "micro_batches": 4})
    st = sorted(p["pipeline"]["stages"], key=lambda s: s["index"])
    per_device = [sum(len(s["blocks"]) for s in st[i::4]) for i in range(4)]
    assert per_device == [3, 3, 3, 3]
    assert [len(s["blocks"]) for s in st] == [1, 1, 1, 1, 2, 2, 2, 2]


def test_searched_v_values_divide_the_blocks_or_take_llama3s_layout():
    from sapp.search.constraints import Constraints
    from sapp.search.joint import SearchContext
    from sapp.search.joint.configs import interleave_values
    from sapp.capture import capture
    from sapp.costmodel import CostSettings
    g = capture(models.get("gpt-tiny", device="meta", l=12), batch=8)
    ctx = SearchContext(g, Cluster.parse("cpu:gpus=4"), 8, Constraints(), CostSettings(), None)
    # v | 12, 2 <= v <= 12 / 2; and v = 7: 14 chunks = 12 blocks + the embedding's + the head's
    assert interleave_values(ctx, 2, 4) == [2, 3, 4, 6, 7]
    assert interleave_values(ctx, 4, 4) == [2, 3]             # 16 chunks: 4 more than 12 blocks + 2
    assert interleave_values(ctx, 4, 6) == []                  # m not a multiple of pp: not searched
