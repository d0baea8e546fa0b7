"""DualPipeV: DeepSeek's DualPipe "cut in half", as torch.distributed.pipelining runs it
(ScheduleDualPipeV, torch 2.13).

The model is cut in 2p chunks (stages) for p pipeline ranks, placed in a V: rank r holds stages r
and 2p - 1 - r, so rank 0 holds the first and the last chunk and stage p - 1 hands its output to
stage p on the same rank (no send there, nor for the gradient coming back).  The backward is split
into the input gradient (I) and the weight gradient (W); torch pairs one micro-batch's forward
with another's full backward in OVERLAP_F_B actions, which its runtime without a registered custom
function runs one after the other (_PipelineScheduleRuntime: `for sub_a in action.sub_actions`), so
they are priced as F then B unless `overlap` says the engine overlaps them (then max(F, B)).

Timing model, as schedule.py's: device i's forward / backward per micro-batch are stage_fwd[i] /
stage_bwd[i] (both chunks), chunk c taking chunk_shares[i][c] of it (1/2 each by default); of a
chunk's backward (recompute excluded) a fraction `w_share` is the weight gradient (W), the rest
plus any recompute the input gradient (I).  W_SHARE = 1/2: a linear layer's backward is two GEMMs
of the forward's size, dX = dY W^T and dW = X^T dY, one each; the cost model keeps no per-stage
split of the two.  Sends are charged to the sender as in schedule.py.

Memory: a micro-batch's activations on a chunk are held from its forward to its W (or full B):
the weight gradient reads the layers' saved inputs.  In whole-device units, each chunk weighing
its share (1/2 each): DeepSeek-V3's report gives DualPipe PP + 1 micro-batches of activations on
2x parameters; DualPipeV's first rank holds 2p + 1 chunk-forwards at its peak (see `in_flight`).

No closed form: on equal chunks without sends the bubble (step - m (F + B) per device) does not
depend on m but is piecewise in the chunk times F_c, B_c, W_c (simulated, F_c = 1: B_c = 2 gives
4 (p - 1) - 1 at W_c = 0, 2.5 (p - 1) - 0.5 from p = 3 at W_c = 1/2, (p - 1) at W_c >= 1; B_c = 1
gives 2 (p - 1) at W_c = 0 and (p - 1) from W_c = 1/2), so the search runs the simulator.  The
report's DualPipe bubble (PP/2 - 1)(F&B + B - 3W) is that of DeepSeek's own order, not torch's.
"""
from __future__ import annotations

import functools

from .events import Event, SimResult, p2p_pairs

W_SHARE = 0.5
# walked operations (F, I, B, W of one chunk) a step at most; as schedule.MAX_SCHEDULE_OPS
MAX_OPS = 1 << 20


def v_stages(p, r) -> tuple:
    """The two stages pipeline rank r of p holds in the V."""
    return r, 2 * p - 1 - r


def stage_rank(p, s) -> int:
    """The pipeline rank stage s of 2p runs on."""
    return s if s < p else 2 * p - 1 - s


def rank_of(schedule, p, s) -> int:
    """The pipeline rank virtual stage s runs on: the V for dualpipev, s mod p for torch's looped
    schedules (interleaved chunk c of rank i is stage c * p + i)."""
    return stage_rank(p, s) if schedule == "dualpipev" else s % p


def chunk_of(schedule, p, s) -> int:
    """Which of its rank's chunks virtual stage s is (0 for the first)."""
    return (0 if s < p else 1) if schedule == "dualpipev" else s // p


def dualpipev_problem(p, m):
    """One line saying why DualPipeV cannot run m micro-batches over p ranks, or None."""
    if p < 2:
        return f"dualpipev needs pp >= 2 (got pp={p})"
    if m < 2 * p:
        return (f"dualpipev needs micro_batches >= its 2 x pp = {2 * p} stages (torch's ScheduleDualPipeV), "
                f"got {m}; use micro_batches >= {2 * p} or the 1f1b schedule")
    if 6 * p * m > MAX_OPS:
        return (f"dualpipev with {m} micro-batches over pp={p} walks {6 * p * m:,} operations a step "
                f"(limit {MAX_OPS:,}); use fewer micro-batches or the 1f1b schedule")
    return None


def _checked(p, m):
    why = dualpipev_problem(p, m)
    if why:
        raise ValueError(why)


@functools.lru_cache(maxsize=128)
def dualpipev_order(p, m) -> tuple:
    """Per rank, torch's ScheduleDualPipeV order (_calculate_single_rank_operations, re-derived) as
    (kind, stage, micro-batch, pair) rows: kind F (forward), B (full backward), I (input gradient),
    W (weight gradient); `pair` numbers the two halves of an OVERLAP_F_B action (-1 outside one)."""
    _checked(p, m)
    return tuple(tuple(_rank_order(p, m, r)) for r in range(p))


def _rank_order(p, m, r):
    ops, count, wq = [], {}, []
    s0, s1 = v_stages(p, r)
    pairs = [0]

    def nxt(s, k):
        return count.get((s, k), 0)

    def add(s, kind, pair=-1):
        mb = nxt(s, "F" if kind == "F" else "I")
        ops.append((kind, s, mb, pair))
        if kind == "F":
            count[(s, "F")] = mb + 1
        elif kind == "I":
            wq.append((s, mb))
            count[(s, "I")] = mb + 1
        else:       # a full backward counts as its input and its weight gradient
            count[(s, "I")] = mb + 1
            count[(s, "W")] = nxt(s, "W") + 1

    def overlap(fs, bs):
        add(fs, "F", pairs[0])
        add(bs, "B", pairs[0])
        pairs[0] += 1

    def weight():
        if wq:
            s, mb = wq.pop(0)
            ops.append(("W", s, mb, -1))
            count[(s, "W")] = nxt(s, "W") + 1

    for _ in range((p - r - 1) * 2):              # 1: F0
        add(s0, "F")
    for _ in range(r + 1):                        # 2: F0 F1
        add(s0, "F")
        add(s1, "F")
    for _ in range(p - r - 1):                    # 3: I1 W1 F1 (zero bubble)
        add(s1, "I")
        weight()
        add(s1, "F")
    for i in range(m - 2 * p + r + 1):            # 4: F0B1-F1B0, the last rank's first pair not overlapped
        if i == 0 and r == p - 1:
            add(s0, "F")
            add(s1, "B")
        else:
            overlap(s0, s1)
        overlap(s1, s0)
    for _ in range(p - r - 1):                    # 5: B1 F1B0
        add(s1, "B")
        overlap(s1, s0)
    zb = False
    for i in range(r + 1):                        # 6: B1 B0, input/weight split from the middle on
        if i == (r + 1) // 2 and r % 2 == 1:
            zb = True
        add(s1, "I" if zb else "B")
        if i == (r + 1) // 2 and r % 2 == 0:
            zb = True
        add(s0, "I" if zb else "B")
    for _ in range(p - r - 1):                    # 7: W0 B0
        weight()
        add(s0, "I" if zb else "B")
    for _ in range(r + 1):                        # 8: W0
        weight()
    return ops


def stage_peak(p, m, s) -> int:
    """Most micro-batches stage s holds activations of at once (from its forward to its W or full
    backward) in torch's order: what the model's last stage, on rank 0, keeps of its head and loss."""
    held = peak = 0
    for kind, st, _, _ in dualpipev_order(p, m)[stage_rank(p, s)]:
        if st == s and kind == "F":
            held += 1
            peak = max(peak, held)
        elif st == s and kind in ("W", "B"):
            held -= 1
    return peak


def _chunk(p, r, s) -> int:
    return 0 if s == r else 1


def dualpipev_in_flight(p, m, chunk_shares=None) -> list:
    """Per rank, peak micro-batches of activations held (whole-device units: a chunk's forward
    weighs its share, 1/2 by default), from torch's order alone: held from F to W or full B."""
    out = []
    for r, order in enumerate(dualpipev_order(p, m)):
        sh = tuple(chunk_shares[r]) if chunk_shares is not None else (0.5, 0.5)
        held = peak = 0.0
        for kind, s, _, _ in order:
            c = _chunk(p, r, s)
            if kind == "F":
                held += sh[c]
                peak = max(peak, held)
            elif kind in ("W", "B"):
                held -= sh[c]
        out.append(peak)
    return out


def _times(stage_fwd, stage_bwd, recompute_s, chunk_shares, w_share, p):
    """Per rank and chunk: (F, full B, I, W, recompute) seconds."""
    rec = list(recompute_s) if recompute_s is not None else [0.0] * p
    out = []
    for i in range(p):
        sh = chunk_shares[i] if chunk_shares is not None else (0.5, 0.5)
        row = []
        for x in sh:
            f, b, rc = stage_fwd[i] * x, stage_bwd[i] * x, rec[i] * x
            w = w_share * (b - rc)
            row.append((f, b, b - w, w, rc))
        out.append(row)
    return out


def simulate_dualpipev(stage_fwd, stage_bwd, m, p2p_s=0.0, recompute_s=None, chunk_shares=None,
                       w_share=W_SHARE, overlap=False, timeline=True) -> SimResult:
    """One step of DualPipeV over p = len(stage_fwd) ranks (see the module doc for the model).
    Returns the step time, per rank the peak in-flight micro-batches (whole-device units) and the
    timeline events (stage = rank, chunk 0 / 1 = its stage r / 2p - 1 - r; kinds fwd, bwd (a full
    backward or an input gradient), wgrad, recompute, comm)."""
    p = len(stage_fwd)
    _checked(p, m)
    pf, pb = zip(*p2p_pairs(p2p_s, p))
    T = _times(stage_fwd, stage_bwd, recompute_s, chunk_shares, w_share, p)
    orders = dualpipev_order(p, m)
    n = 2 * p
    done_f = [[None] * m for _ in range(n)]
    done_b = [[None] * m for _ in range(n)]     # the input gradient of (stage, mb), on its way back
    pos, free, events = [0] * p, [0.0] * p, []
    remaining = sum(len(o) for o in orders)
    while remaining:
        moved = False
        for r in range(p):
            k = pos[r]
            while k < len(orders[r]):
                step = _pair(orders[r], k) if overlap else 1
                t = _ready(orders[r][k:k + step], done_f, done_b, n, free[r])
                if t is None:
                    break
                free[r] = _run(orders[r][k:k + step], t, r, p, T, pf, pb, done_f, done_b, events, timeline)
                k += step
            remaining -= k - pos[r]
            moved = moved or k > pos[r]
            pos[r] = k
        if not moved:
            raise RuntimeError("dualpipev schedule deadlocked (internal error)")
    return SimResult(max(free), dualpipev_in_flight(p, m, chunk_shares), events)


def _pair(order, k) -> int:
    """Rows the op at k spans when overlapped: both halves of an OVERLAP_F_B, else 1."""
    pair = order[k][3]
    return 2 if pair >= 0 and k + 1 < len(order) and order[k + 1][3] == pair else 1


def _ready(ops, done_f, done_b, n, free):
    """When the ops (one, or an overlapped pair) may start, or None while an input is missing."""
    t = free
    for kind, s, j, _ in ops:
        if kind == "F":
            dep = done_f[s - 1][j] if s > 0 else 0.0
        elif kind == "W":
            dep = 0.0                       # its I ran before on this rank (torch's order)
        else:
            dep = done_b[s + 1][j] if s < n - 1 else done_f[s][j]
        if dep is None:
            return None
        t = max(t, dep)
    return t


def _run(ops, t, r, p, T, pf, pb, done_f, done_b, events, timeline) -> float:
    """Run ops from t; returns when the rank is free again.  An overlapped pair takes the longer
    of the two, its sends after it."""
    dur = [T[r][_chunk(p, r, s)][{"F": 0, "B": 1, "I": 2, "W": 3}[kind]] for kind, s, _, _ in ops]
    end = t + (max(dur) if len(ops) > 1 else 0.0)
    for (kind, s, j, _), d in zip(ops, dur):
        c = _chunk(p, r, s)
        if len(ops) == 1:
            end = t + d
        if timeline:
            rc = T[r][c][4] if kind in ("B", "I") else 0.0
            if rc > 0:
                events.append(Event(r, j, "recompute", end - d, end - d + rc, c))
            events.append(Event(r, j, {"F": "fwd", "W": "wgrad"}.get(kind, "bwd"), end - d + rc, end, c))
        send = _send(kind, s, p, r, pf, pb)
        if send > 0:
            if timeline:
                events.append(Event(r, j, "comm", end, end + send, c))
            end += send
        if kind == "F":
            done_f[s][j] = end
        elif kind != "W":
            done_b[s][j] = end
        t = end
    return end


def _send(kind, s, p, r, pf, pb) -> float:
    """Seconds of the send after op (kind, s): none into the same rank (stage p - 1 to p and back),
    none after the model's last forward, the first stage's backward or a weight gradient."""
    if kind == "F":
        return pf[r] if s not in (p - 1, 2 * p - 1) else 0.0
    if kind == "W":
        return 0.0
    return pb[r] if s not in (0, p) else 0.0


def dualpipev_step(stage_fwd, stage_bwd, m, p2p_s=0.0, chunk_shares=None, w_share=W_SHARE,
                   overlap=False) -> float:
    """Step time of DualPipeV: the simulator's (no closed form holds, see the module doc)."""
    return simulate_dualpipev(stage_fwd, stage_bwd, m, p2p_s, chunk_shares=chunk_shares, w_share=w_share,
                              overlap=overlap, timeline=False).step_s
