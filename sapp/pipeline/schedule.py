"""Pipeline schedules: an event simulator (for timelines, plots and checks) and the closed forms the
joint search uses (same numbers on uniform stages, tested against each other).

Timing model.  Stage i takes tf[i] / tb[i] per micro-batch forward / backward (its whole share; with
interleaving each of its v chunks takes 1/v of that).  Sending a stage-boundary tensor costs `p2p_s`
and is charged to the sender (blocking send, as in Megatron's 1F1B): forward activations after each
forward on every stage but the last, gradients after each backward on every stage but the first.
Recompute time (if any) is part of tb and shown as its own event just before the backward.

Closed form used by the search (exact on uniform stages, both GPipe and 1F1B):
    step = (m - 1) * max_i T_i + sum_i T_i                      T_i = tf_i + tb_i + its sends
and interleaved 1F1B with v chunks:  m * max_i T_i + (sum_i T_i - max_i T_i) / v
so the bubble fraction is (p - 1) / m, resp. (p - 1) / (v m).
"""
from __future__ import annotations

from dataclasses import dataclass, field

SCHEDULES = ("gpipe", "1f1b", "interleaved")


@dataclass
class Event:
    stage: int
    mb: int
    kind: str        # "fwd" | "bwd" | "recompute" | "comm"
    start: float
    end: float
    chunk: int = 0

    def to_dict(self) -> dict:
        return {"stage": self.stage, "mb": self.mb, "kind": self.kind, "start": self.start,
                "end": self.end, "chunk": self.chunk}


@dataclass
class SimResult:
    step_s: float
    in_flight: list          # per stage: peak micro-batches of activations held (stage units)
    events: list = field(default_factory=list)


def stage_totals(stage_fwd, stage_bwd, p2p_s=0.0, v=1) -> list:
    """T_i per micro-batch including the stage's own sends (v chunks send v times)."""
    p = len(stage_fwd)
    out = []
    for i in range(p):
        sends = (1 if i < p - 1 else 0) + (1 if i > 0 else 0)
        if v > 1:       # every chunk boundary is a send, except the model's very first/last chunk
            sends = 2 * v - (1 if i == p - 1 else 0) - (1 if i == 0 else 0)
        out.append(stage_fwd[i] + stage_bwd[i] + sends * p2p_s)
    return out


def step_time(stage_fwd, stage_bwd, m, schedule="1f1b", v=1, p2p_s=0.0) -> float:
    """Closed-form step time of one pipeline (see module doc)."""
    T = stage_totals(stage_fwd, stage_bwd, p2p_s, v if schedule == "interleaved" else 1)
    tmax, tsum = max(T), sum(T)
    if schedule == "interleaved" and v > 1:
        return m * tmax + (tsum - tmax) / v
    return (m - 1) * tmax + tsum


def in_flight(schedule, p, m, v=1) -> list:
    """Peak micro-batches whose activations a stage holds at once (in whole-stage units).  "none" is
    gradient accumulation without a pipeline: the emitted loop runs each micro-batch's forward and
    backward before the next one starts, so one micro-batch is held whatever m is."""
    if schedule == "none":
        return [1.0] * p
    if schedule == "gpipe":
        return [float(m)] * p
    if schedule == "interleaved" and v > 1:
        out = []
        for i in range(p):
            chunks = min((p - i - 1) * 2 + (v - 1) * p + 1, m * v)
            out.append(chunks / v)
        return out
    return [float(min(p - i, m)) for i in range(p)]


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
        else:   # interleaved 1F1B (Megatron order; needs m % p == 0)
            total = m * v

            def fwd_id(k):
                return ((k // (p * v)) * p + k % p, (k // p) % v)

            def bwd_id(k):
                return ((k // (p * v)) * p + k % p, v - 1 - (k // p) % v)
            w = min((p - i - 1) * 2 + (v - 1) * p, total)
            ops = [("fwd",) + fwd_id(k) for k in range(w)]
            f, b = w, 0
            while b < total:
                if f < total:
                    ops.append(("fwd",) + fwd_id(f))
                    f += 1
                ops.append(("bwd",) + bwd_id(b))
                b += 1
        orders.append(ops)
    return orders


def simulate(stage_fwd, stage_bwd, m, schedule="1f1b", v=1, p2p_s=0.0, recompute_s=None) -> SimResult:
    """Simulate one training step.  `recompute_s[i]` (part of stage_bwd[i]) is drawn as a separate
    event before each backward.  Returns the step time, per-stage peak in-flight micro-batches and
    the timeline events (stage, mb, kind, start, end)."""
    p = len(stage_fwd)
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}")
    if schedule != "interleaved":
        v = 1
    if schedule == "interleaved" and m % p:
        raise ValueError(f"interleaved 1F1B needs micro-batches ({m}) divisible by stages ({p})")
    rec = list(recompute_s) if recompute_s is not None else [0.0] * p
    n_chunks = p * v
    tf = [stage_fwd[i] / v for i in range(p)]
    tb = [stage_bwd[i] / v for i in range(p)]
    rc = [rec[i] / v for i in range(p)]
    orders = _orders(schedule, p, m, v)
    done = {}            # (kind, global chunk, mb) -> time its output (incl. send) is available
    pos = [0] * p
    free = [0.0] * p
    events = []
    held = [0] * p
    peak = [0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for i in range(p):
            while pos[i] < len(orders[i]):
                kind, j, c = orders[i][pos[i]]
                g = c * p + i                      # global chunk index (model order)
                if kind == "fwd":
                    dep = done.get(("fwd", g - 1, j)) if g > 0 else 0.0
                else:
                    dep = done.get(("bwd", g + 1, j)) if g < n_chunks - 1 else done.get(("fwd", g, j))
                if dep is None:
                    break
                t = max(free[i], dep)
                if kind == "fwd":
                    end = t + tf[i]
                    events.append(Event(i, j, "fwd", t, end, c))
                    held[i] += 1
                    peak[i] = max(peak[i], held[i])
                    if g < n_chunks - 1 and p2p_s > 0:
                        events.append(Event(i, j, "comm", end, end + p2p_s, c))
                        end += p2p_s
                else:
                    if rc[i] > 0:
                        events.append(Event(i, j, "recompute", t, t + rc[i], c))
                    end = t + tb[i]
                    events.append(Event(i, j, "bwd", t + rc[i], end, c))
                    held[i] -= 1
                    if g > 0 and p2p_s > 0:
                        events.append(Event(i, j, "comm", end, end + p2p_s, c))
                        end += p2p_s
                done[(kind, g, j)] = end
                free[i] = end
                pos[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked (internal error)")
    step = max(free)
    return SimResult(step, [pk / v for pk in peak], events)
