"""Which forwards and backwards of a pipeline schedule run beside one another, so that each one's MoE
all-to-alls can hide behind the other's compute (Megatron-Core's --overlap-moe-expert-parallel-comm;
DeepSeek-V3's DualPipe).  Pure: read off the schedule's own per-rank order.

Megatron-Core core_v0.16.1 runs it in its combined 1F1B (pipeline_parallel/combined_1f1b.py,
models/common/model_chunk_schedule_plan.py `TransformerLayerSchedulePlan.run`): in each 1F1B step the
forward of one micro-batch and the backward of another go layer by layer on two streams,
    comm stream:    combine_bwd | dispatch_fwd -> dispatch_bwd            | combine_fwd
    compute stream: attn_fwd    | mlp_bwd -> mlp_bwd_dw -> mlp_fwd        | attn_bwd
(it adds one warm-up forward so the two are never the same micro-batch).  The warm-up forwards and
cool-down backwards have no partner and run their all-to-alls exposed.  Here a forward and a
backward of different micro-batches next to each other in a rank's order are one pair (each op in
at most one pair, walked from the start); under torch's ScheduleDualPipeV the pairs are its
OVERLAP_F_B actions.

`overlap_problem` states Megatron-Core's own conditions (TransformerConfig.__post_init__) in one line."""
from __future__ import annotations

import functools

from .schedule import _order_rows, interleave_rounds

OVERLAP_SCHEDULES = ("interleaved", "dualpipev")


def overlap_problem(*, pp: int, schedule, v: int, ep: int, full_recompute: bool, mixed: bool):
    """One line saying why Megatron-Core refuses --overlap-moe-expert-parallel-comm here, or None."""
    if ep <= 1:
        return "moe_a2a_overlap needs expert parallelism (ep > 1): it hides the MoE all-to-alls"
    if pp > 1 and not (schedule == "dualpipev" or (schedule == "interleaved" and v > 1)):
        return (f"moe_a2a_overlap at pp={pp} needs virtual pipeline stages (schedule interleaved with "
                f"virtual_chunks >= 2) or schedule dualpipev, not {schedule}")
    if full_recompute:
        return "moe_a2a_overlap cannot run beside full recomputation (Megatron-Core's rule); use none or selective"
    if not mixed:
        return "moe_a2a_overlap runs in bf16 or fp16 only (Megatron-Core's rule); use bf16-mixed"
    return None


@functools.lru_cache(maxsize=256)
def paired_fraction(schedule, p: int, m: int, v: int = 1) -> float:
    """The fraction of forwards (= of backwards) that run paired, on the rank with the fewest pairs
    (the most warm-up: the first; its exposed all-to-alls bound the step).  pp = 1 ("none") runs
    Megatron's no-pipelining combined 1F1B: the 1f1b order over one rank."""
    if schedule == "dualpipev":
        return _dualpipev_fraction(p, m)
    if p <= 1 or schedule in (None, "none"):
        schedule, p, v = "1f1b", 1, 1
    if schedule != "interleaved":
        v = 1
    if schedule == "interleaved" and interleave_rounds(p, m) is None:
        # an m torch's order cannot run (not a multiple of its rounds): Megatron-Core's own count
        # (schedules.get_pp_rank_microbatches: 2 (p - 1) + (v - 1) p warm-up forwards on the first rank,
        # one more with the overlap; the rest run in 1F1B steps of one forward and one backward)
        return max(0, m * v - min(m * v, 2 * (p - 1) + (v - 1) * p + 1)) / float(m * v)
    rows = _order_rows(schedule, p, m, v)
    return min(_pairs(r) for r in rows) / float(m * v)


def _pairs(order) -> int:
    """Pairs in one rank's (forward?, micro-batch, chunk, global chunk) rows: a forward next to a
    backward of another micro-batch (or chunk), each op in one pair at most."""
    n, k = 0, 0
    while k + 1 < len(order):
        a, b = order[k], order[k + 1]
        if a[0] != b[0] and (a[1], a[2]) != (b[1], b[2]):
            n, k = n + 1, k + 2
        else:
            k += 1
    return n


def _dualpipev_fraction(p: int, m: int) -> float:
    """DualPipeV: forwards inside an OVERLAP_F_B action over all forwards, on the rank with fewest."""
    from .dualpipe import dualpipev_order
    best = None
    for order in dualpipev_order(p, m):
        fwd = sum(1 for r in order if r[0] == "F")
        paired = sum(1 for r in order if r[0] == "F" and r[3] >= 0)
        f = paired / fwd if fwd else 0.0
        best = f if best is None else min(best, f)
    return best or 0.0
