"""Pipeline schedules: an event simulator (for timelines, plots and checks) and the closed forms the
joint search uses (same numbers on uniform stages, tested against each other).

Timing model.  Stage i takes tf[i] / tb[i] per micro-batch forward / backward (its whole share; with
interleaving each of its v chunks takes 1/v of that).  Sending a stage boundary's tensors costs `p2p_s`
(or a (forward, backward) pair when they differ, or one pair per stage) and is charged to the sender
(blocking send, as in Megatron's 1F1B): forward activations after each forward on every stage but
the last, gradients after each backward on every stage but the first.
Recompute time (if any) is part of tb and shown as its own event just before the backward.

Closed form used by the search (exact on uniform stages, both GPipe and 1F1B):
    step = (m - 1) * max_i T_i + sum_i T_i                      T_i = tf_i + tb_i + its sends
and interleaved 1F1B with v chunks:  m * max_i T_i + (sum_i T_i - max_i T_i) / v
so the bubble fraction is (p - 1) / m, resp. (p - 1) / (v m).  The interleaved closed form holds
when m is a multiple of p and every device's chunks take equal time; otherwise (torch's "flex"
interleaving: m need only be a multiple of its rounds, max(1, m // p); chunks of different block
counts) `step_time` runs the event simulator, which follows torch's own per-rank order
(torch.distributed.pipelining.ScheduleInterleaved1F1B, torch 2.13).
DualPipeV (2 chunks a device in a V, weight gradients apart) has no closed form: dualpipe.py
simulates it in torch's ScheduleDualPipeV order.
"""
from __future__ import annotations

import functools

from .dualpipe import dualpipev_in_flight, dualpipev_step, simulate_dualpipev
from .events import Event, SimResult, p2p_pairs as _p2p  # noqa: F401 - Event re-exported (sapp.pipeline)

SCHEDULES = ("gpipe", "1f1b", "interleaved", "dualpipev")
# Operations (a forward or a backward of one chunk on one device) the event simulator and torch's
# order tables walk for one step, at most: ~2 us each in Python, so a couple of seconds.  The closed
# forms cover everything else; an interleaved configuration past it (2^22 micro-batches: minutes and
# gigabytes) is not searched and is refused when pinned or evaluated (a bubble of (p - 1) / (v m) is
# nil there: 1F1B runs it as well).
MAX_SCHEDULE_OPS = 1 << 20


def schedule_ops(p, m, v=1) -> int:
    """Forward and backward operations of one step over all p devices' v chunks."""
    return 2 * p * v * m


def too_long(p, m, v):
    """One line saying why (p, m, v) interleaved is past MAX_SCHEDULE_OPS, or None."""
    if schedule_ops(p, m, v) <= MAX_SCHEDULE_OPS:
        return None
    return (f"interleaved 1F1B with {m} micro-batches over pp={p} x {v} chunks walks "
            f"{schedule_ops(p, m, v):,} operations a step (limit {MAX_SCHEDULE_OPS:,}); use fewer micro-batches "
            f"or the 1f1b schedule")


def stage_totals(stage_fwd, stage_bwd, p2p_s=0.0, v=1) -> list:
    """T_i per micro-batch including the stage's own sends (v chunks send v times each way)."""
    p = len(stage_fwd)
    out = []
    for i, (pf, pb) in enumerate(_p2p(p2p_s, p)):
        # every chunk boundary is a send, except the model's very first/last chunk
        nf, nb = v - (1 if i == p - 1 else 0), v - (1 if i == 0 else 0)
        out.append(stage_fwd[i] + stage_bwd[i] + nf * pf + nb * pb)
    return out


def step_time(stage_fwd, stage_bwd, m, schedule="1f1b", v=1, p2p_s=0.0, chunk_shares=None, overlap_fb=False) -> float:
    """Step time of one pipeline: the closed form (see module doc), or for interleaved schedules the
    closed form cannot describe (m not a multiple of p; `chunk_shares[i]`: the fractions of stage
    i's time its v chunks take, when they differ) and for dualpipev (`overlap_fb`: the engine overlaps
    an OVERLAP_F_B pair; torch's runtime runs it F then B) the event simulator."""
    p = len(stage_fwd)
    if schedule == "dualpipev":     # no closed form holds: its bubble is piecewise in F, B, W (dualpipe.py)
        return dualpipev_step(stage_fwd, stage_bwd, m, p2p_s, chunk_shares=chunk_shares, overlap=overlap_fb)
    if schedule == "interleaved" and v > 1 and (m % p or not _equal_shares(chunk_shares)):
        return simulate(stage_fwd, stage_bwd, m, schedule, v=v, p2p_s=p2p_s, chunk_shares=chunk_shares,
                        timeline=False).step_s
    T = stage_totals(stage_fwd, stage_bwd, p2p_s, v if schedule == "interleaved" else 1)
    tmax, tsum = max(T), sum(T)
    if schedule == "interleaved" and v > 1:
        return m * tmax + (tsum - tmax) / v
    return (m - 1) * tmax + tsum


def _equal_shares(shares) -> bool:
    if shares is None:
        return True
    return all(max(sh) - min(sh) <= 1e-12 * max(max(sh), 1e-300) for sh in shares)


def interleave_rounds(p, m):
    """(rounds, micro-batches per round) of torch's interleaved 1F1B, or None when torch refuses m:
    rounds = max(1, m // p) and m must be a multiple of it."""
    rounds = max(1, m // p)
    if m % rounds:
        return None
    return rounds, m // rounds


def _warmup(i, p, m, v):
    """Forwards rank i runs before its first backward in torch's interleaved 1F1B
    (schedules._get_warmup_ops): (v - 1) rounds' worth on the last rank, 2 more per hop before it."""
    mpr = interleave_rounds(p, m)[1]
    return min((v - 1) * mpr + 2 * (p - 1 - i), m * v)


def in_flight(schedule, p, m, v=1) -> list:
    """Peak micro-batches whose activations a stage holds at once (in whole-stage units).  "none" is
    gradient accumulation without a pipeline: the emitted loop runs each micro-batch's forward and
    backward before the next one starts, so one micro-batch is held whatever m is."""
    if schedule == "none":
        return [1.0] * p
    if schedule == "gpipe":
        return [float(m)] * p
    if schedule == "dualpipev":     # torch's order walked: forwards held until their W (dualpipe.py)
        return dualpipev_in_flight(p, m)
    if schedule == "interleaved" and v > 1:
        if interleave_rounds(p, m) is None:
            raise ValueError(f"interleaved 1F1B cannot run {m} micro-batches over {p} stages "
                             f"(m must be a multiple of max(1, m // p) = {max(1, m // p)})")
        # one more forward than the warm-up before the first backward frees a chunk (in stage units)
        return [min(_warmup(i, p, m, v) + 1, m * v) / v for i in range(p)]
    return [float(min(p - i, m)) for i in range(p)]


def chunk_in_flight(p, m, v, i, blocks) -> float:
    """In-flight micro-batches of interleaved device i in whole-stage units when its v chunks hold
    `blocks[c]` blocks each: the peak over torch's order of the live forwards of each chunk weighted
    by its share of the stage's blocks.  Equal chunks give in_flight's (warm-up + 1) / v; unequal ones
    differ because the peak holds the early chunks more often than the late ones: Llama 3's layout
    (a first chunk of the embedding alone, a last one of the head and loss alone) holds the blockless
    chunk's forwards for nothing, and chunks of 1 and 2 blocks are not average ones."""
    return chunk_peak(p, m, v, i, tuple(blocks))[0]


@functools.lru_cache(maxsize=4096)
def chunk_peak(p, m, v, i, blocks) -> tuple:
    """(chunk_in_flight, per chunk: whether one of its backwards ran before that peak).  FSDP2 keeps a
    chunk's unsharded gradient accumulators from its first backward to the step's last, so at the
    peak only the chunks already through a backward hold them (numbers.held_states)."""
    k = sum(blocks)
    if k <= 0:
        return in_flight("interleaved", p, m, v)[i], (True,) * v
    held, peak, at = 0.0, 0.0, 0
    order = _order_rows("interleaved", p, m, v)[i]
    for n, (fwd, _, c, _) in enumerate(order):
        held += blocks[c] if fwd else -blocks[c]
        if held > peak:
            peak, at = held, n
    seen = {c for fwd, _, c, _ in order[:at] if not fwd}
    return peak / k, tuple(c in seen for c in range(v))


# ---- event simulator --------------------------------------------------------------------------
def _orders(schedule, p, m, v):
    """Per device, the ordered list of ops (kind, mb, chunk)."""
    orders = []
    for i in range(p):
        if schedule == "gpipe":
            ops = [("fwd", j, 0) for j in range(m)] + [("bwd", j, 0) for j in range(m)]
        elif schedule == "1f1b":
            w = min(p - i - 1, m)
            ops = [("fwd", j, 0) for j in range(w)]
            f, b = w, 0
            while b < m:
                if f < m:
                    ops.append(("fwd", f, 0))
                    f += 1
                ops.append(("bwd", b, 0))
                b += 1
        else:   # interleaved 1F1B in torch's order (Megatron's when m % p == 0)
            total = m * v
            mpr = interleave_rounds(p, m)[1]
            nxt = {("fwd", c): 0 for c in range(v)}
            nxt.update({("bwd", c): 0 for c in range(v)})

            def op(kind, k):
                # the k-th forward (backward) of this rank runs chunk (k // mpr) % v (counted from
                # the last chunk for backwards), on that chunk's next micro-batch
                c = (k // mpr) % v
                if kind == "bwd":
                    c = v - 1 - c
                j = nxt[(kind, c)]
                nxt[(kind, c)] = j + 1
                return (kind, j, c)
            w = _warmup(i, p, m, v)
            ops = [op("fwd", k) for k in range(w)]
            f, b = w, 0
            while b < total:
                if f < total:
                    ops.append(op("fwd", f))
                    f += 1
                ops.append(op("bwd", b))
                b += 1
        orders.append(ops)
    return orders


@functools.lru_cache(maxsize=128)
def _order_rows(schedule, p, m, v):
    """`_orders` per device as (forward?, micro-batch, chunk, global chunk) rows, cached: the search
    simulates and walks the same few (schedule, p, m, v) many times."""
    return tuple(tuple((k == "fwd", j, c, c * p + i) for k, j, c in o)
                 for i, o in enumerate(_orders(schedule, p, m, v)))


def _checked_chunks(schedule, p, m, v) -> int:
    """The chunks per stage `schedule` runs (v for interleaved, else 1); ValueError, in one line, for
    an unknown schedule or one too long to simulate or that cannot run m micro-batches over p stages."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}")
    if schedule != "interleaved":
        v = 1
    if schedule_ops(p, m, v) > MAX_SCHEDULE_OPS:
        raise ValueError(too_long(p, m, v) if schedule == "interleaved" else
                         f"{schedule} with {m} micro-batches over {p} stages is too long to simulate "
                         f"(limit {MAX_SCHEDULE_OPS:,} operations)")
    if schedule == "interleaved" and interleave_rounds(p, m) is None:
        raise ValueError(f"interleaved 1F1B cannot run {m} micro-batches over {p} stages "
                         f"(m must be a multiple of max(1, m // p) = {max(1, m // p)})")
    return v


def _chunk_times(stage_fwd, stage_bwd, recompute_s, chunk_shares, p, v):
    """(forward, backward, recompute) seconds of each stage's chunks: [stage][chunk], each stage's
    time split by its chunk shares (default 1/v each)."""
    rec = list(recompute_s) if recompute_s is not None else [0.0] * p
    sh = [list(chunk_shares[i]) if chunk_shares is not None else [1.0 / v] * v for i in range(p)]
    tf = [[stage_fwd[i] * x for x in sh[i]] for i in range(p)]
    tb = [[stage_bwd[i] * x for x in sh[i]] for i in range(p)]
    rc = [[rec[i] * x for x in sh[i]] for i in range(p)]
    return tf, tb, rc


def simulate(stage_fwd, stage_bwd, m, schedule="1f1b", v=1, p2p_s=0.0, recompute_s=None,
             chunk_shares=None, timeline=True) -> SimResult:
    """Simulate one training step.  `recompute_s[i]` (part of stage_bwd[i]) is drawn as a separate
    event before each backward.  `chunk_shares[i]` (interleaved): the fractions of stage i's times
    its v chunks take (default 1/v each).  Returns the step time, per-stage peak in-flight
    micro-batches (stage units) and the timeline events (stage, mb, kind, start, end).  `p2p_s`: one
    send's seconds, a (forward, backward) pair, or one pair per stage.  `timeline` False: no events
    (the search prices many configurations here and reads only the step time).  dualpipev: its own
    simulator (dualpipe.py: v is 2, its chunks in the V, weight gradients apart)."""
    p = len(stage_fwd)
    if schedule == "dualpipev":
        return simulate_dualpipev(stage_fwd, stage_bwd, m, p2p_s, recompute_s, chunk_shares, timeline=timeline)
    pf, pb = zip(*_p2p(p2p_s, p))
    v = _checked_chunks(schedule, p, m, v)
    n_chunks = p * v
    tf, tb, rc = _chunk_times(stage_fwd, stage_bwd, recompute_s, chunk_shares, p, v)
    orders = _order_rows(schedule, p, m, v)
    # the time each (global chunk, micro-batch)'s forward / backward output (send included) is there
    done_f = [[None] * m for _ in range(n_chunks)]
    done_b = [[None] * m for _ in range(n_chunks)]
    pos, free = [0] * p, [0.0] * p
    events = []
    held, peak = [0] * p, [0] * p
    lens = [len(o) for o in orders]
    remaining = sum(lens)
    while remaining:
        progressed = False
        for i in range(p):
            o, k, fi = orders[i], pos[i], free[i]
            while k < lens[i]:
                fwd, j, c, g = o[k]
                if fwd:
                    dep = done_f[g - 1][j] if g > 0 else 0.0
                else:
                    dep = done_b[g + 1][j] if g < n_chunks - 1 else done_f[g][j]
                if dep is None:
                    break
                t = fi if fi >= dep else dep
                if fwd:
                    end = t + tf[i][c]
                    held[i] += 1
                    if held[i] > peak[i]:
                        peak[i] = held[i]
                    if timeline:
                        events.append(Event(i, j, "fwd", t, end, c))
                    if g < n_chunks - 1 and pf[i] > 0:
                        if timeline:
                            events.append(Event(i, j, "comm", end, end + pf[i], c))
                        end += pf[i]
                    done_f[g][j] = end
                else:
                    end = t + tb[i][c]
                    held[i] -= 1
                    if timeline:
                        if rc[i][c] > 0:
                            events.append(Event(i, j, "recompute", t, t + rc[i][c], c))
                        events.append(Event(i, j, "bwd", t + rc[i][c], end, c))
                    if g > 0 and pb[i] > 0:
                        if timeline:
                            events.append(Event(i, j, "comm", end, end + pb[i], c))
                        end += pb[i]
                    done_b[g][j] = end
                fi = end
                k += 1
            remaining -= k - pos[i]
            progressed = progressed or k > pos[i]
            pos[i], free[i] = k, fi
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked (internal error)")
    step = max(free)
    return SimResult(step, [pk / v for pk in peak], events)
