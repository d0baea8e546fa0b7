"""A plan's pipeline timeline: events (stage, micro-batch, kind, start, end) for the Gantt chart.

`plan_timeline(plan)` replays the plan's per-stage times through sapp.pipeline.schedule.simulate (the
same simulator the joint search prices plans with), so the chart shows what was predicted."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import PlanError

SCHEDULES = ("none", "gpipe", "1f1b", "interleaved")
KINDS = ("fwd", "bwd", "recompute", "comm", "sync", "host", "exposed", "optimizer")
# communication drawn by the schedule itself (p2p) or as the gradient-sync tail; the rest of the
# plan's exposed communication (batch-norm statistics, the loss, resharding, ...) is drawn as its own tail
DRAWN_COMM = ("dp_grad_sync", "pp_p2p")


@dataclass(frozen=True)
class Event:
    stage: int          # device stage (row in the chart)
    micro_batch: int    # -1 for per-step work (gradient sync, host optimizer)
    kind: str           # one of KINDS
    start: float
    end: float
    chunk: int = 0      # virtual chunk for interleaved schedules

    @property
    def duration(self):
        return self.end - self.start


def simulate_schedule(fwd_s, bwd_s, micro_batches, schedule="1f1b", *, virtual_chunks=1, p2p_s=0.0,
                      recompute_s=None):
    """One training step's pipeline as chart events, from per-*virtual*-stage times (len p*v; virtual
    stage k lives on device k % p, chunk k // p).  `bwd_s` includes recompute; `recompute_s` (optional,
    same length) is drawn as its own event.  The schedule itself is sapp.pipeline.schedule.simulate,
    the simulator the joint search prices plans with.  Returns (events, makespan)."""
    from ..pipeline.schedule import SCHEDULES as PIPE_SCHEDULES
    from ..pipeline.schedule import simulate
    v = max(1, int(virtual_chunks))
    n_virtual = len(fwd_s)
    if n_virtual == 0 or len(bwd_s) != n_virtual or n_virtual % v:
        raise PlanError("pipeline stages must list fwd/bwd times for every (virtual) stage")
    if schedule not in SCHEDULES:
        raise PlanError(f"unknown pipeline schedule {schedule!r}; use gpipe, 1f1b, interleaved or none")
    p, m = n_virtual // v, int(micro_batches)
    if m < 1:
        raise PlanError("pipeline.micro_batches must be a positive integer")
    rc = list(recompute_s) if recompute_s else [0.0] * n_virtual
    per_dev = lambda xs: [sum(xs[c * p + i] for c in range(v)) for i in range(p)]  # noqa: E731
    p2p = max(p2p_s) if isinstance(p2p_s, (list, tuple)) else float(p2p_s)
    sched = schedule if schedule in PIPE_SCHEDULES and schedule != "none" else "1f1b"
    shares = None
    if v > 1:     # chunks of different sizes (sapp.pipeline.partition.chunk_counts): their own shares
        tot = per_dev([f + b for f, b in zip(fwd_s, bwd_s)])
        shares = [[(fwd_s[c * p + i] + bwd_s[c * p + i]) / tot[i] if tot[i] > 0 else 1.0 / v for c in range(v)]
                  for i in range(p)]
    try:
        res = simulate(per_dev(fwd_s), per_dev(bwd_s), m, sched, v=v, p2p_s=p2p, recompute_s=per_dev(rc),
                       chunk_shares=shares)
    except ValueError as e:
        raise PlanError(str(e)) from None
    events = sorted(normalise_events(res.events), key=lambda e: (e.stage, e.start, e.kind))
    return events, res.step_s


def _stage_times(plan, per_device=False):
    pipe = plan["pipeline"]
    stages = sorted(pipe.get("stages") or [], key=lambda s: s.get("index", 0))
    pred = plan["predicted"]
    p = int(plan["parallel"]["pp"])
    v = max(1, int(pipe.get("virtual_chunks") or 1))
    m = int(pipe["micro_batches"])
    if stages and all("fwd_s" in s.get("predicted", {}) for s in stages):
        f = [float(s["predicted"]["fwd_s"]) for s in stages]
        b = [float(s["predicted"].get("bwd_s", 2 * s["predicted"]["fwd_s"])) for s in stages]
        rc = [float(s["predicted"].get("recompute_s", 0.0)) for s in stages]
        p2p = [float(s["predicted"].get("p2p_s", s["predicted"].get("send_s", 0.0))) for s in stages]
    else:
        # No per-stage figures: split the predicted compute evenly (fwd:bwd = 1:2, the usual ratio).
        per_mb = float(pred.get("compute_s", pred["step_time_s"])) / max(m, 1) / max(p, 1)
        f, b, rc, p2p = [per_mb / 3] * p, [per_mb * 2 / 3] * p, [0.0] * p, [0.0] * p
    if per_device:
        if len(f) == p * v and v > 1:     # per virtual stage listed: sum each device's chunks
            f = [sum(f[c * p + i] for c in range(v)) for i in range(p)]
            b = [sum(b[c * p + i] for c in range(v)) for i in range(p)]
            rc = [sum(rc[c * p + i] for c in range(v)) for i in range(p)]
            p2p = p2p[:p]
        return f, b, rc, p2p, v, m
    if len(f) == p and v > 1:        # per device stage: split each device's time over its chunks
        f = [x / v for _ in range(v) for x in f]
        b = [x / v for _ in range(v) for x in b]
        rc = [x / v for _ in range(v) for x in rc]
        p2p = [x for _ in range(v) for x in p2p]
    return f, b, rc, p2p, v, m


def _normalise(ev):
    """Accept events as Event, dict, tuple (stage, mb, kind, start, end) or an object with those attributes."""
    if isinstance(ev, Event):
        return ev
    if isinstance(ev, dict):
        g = ev.get
        return Event(int(g("stage")), int(g("micro_batch", g("mb", -1))), str(g("kind")), float(g("start")),
                     float(g("end")), int(g("chunk", 0) or 0))
    if isinstance(ev, (tuple, list)):
        return Event(int(ev[0]), int(ev[1]), str(ev[2]), float(ev[3]), float(ev[4]))
    g = lambda k, d=None: getattr(ev, k, d)  # noqa: E731
    return Event(int(g("stage")), int(g("micro_batch", g("mb", -1))), str(g("kind")), float(g("start")),
                 float(g("end")), int(g("chunk", 0) or 0))


def normalise_events(events):
    out = [_normalise(e) for e in events]
    kinds = {"forward": "fwd", "backward": "bwd", "p2p": "comm", "send": "comm", "recv": "comm"}
    return [Event(e.stage, e.micro_batch, kinds.get(e.kind, e.kind), e.start, e.end, e.chunk) for e in out]


def plan_timeline(plan, *, use_team_simulator=True):
    """Events for one step of `plan` (sorted by stage, start).  Adds per-step tails: gradient
    sync (stage predicted `grad_sync_s`, else the plan's predicted `grad_sync_s`: every schedule shows
    it) and host work (placement predicted `host_s`) when present."""
    f, b, rc, p2p, v, m = _stage_times(plan)
    schedule = plan["pipeline"].get("schedule", "none")
    if int(plan["parallel"]["pp"]) == 1 and schedule != "none":
        schedule = "none"
    if use_team_simulator and (ev := _team_simulate(plan)) is not None:
        events = ev
    else:
        events, _ = simulate_schedule(f, b, m, schedule, virtual_chunks=v, p2p_s=p2p, recompute_s=rc)
    p = int(plan["parallel"]["pp"])
    stages = sorted(plan["pipeline"].get("stages") or [], key=lambda s: s.get("index", 0))
    # a stage's exposed gradient sync: its own figure where the plan lists one (plain stages); an
    # interleaved plan's virtual chunks carry none, so every device shows the step's (the slowest stage's)
    step_sync = float(plan["predicted"].get("grad_sync_s", 0.0) or 0.0)
    tails = []
    for i in range(p):
        end = max((e.end for e in events if e.stage == i), default=0.0)
        own = [s["predicted"]["grad_sync_s"] for s in stages
               if int(s.get("device_stage", s.get("index", -1))) == i and "grad_sync_s" in (s.get("predicted") or {})]
        sync = float(max(own)) if own else step_sync
        if sync > 0:
            tails.append(Event(i, -1, "sync", end, end + sync))
            end += sync
        host = float((plan["placement"].get("predicted") or {}).get("host_s", 0.0) or 0.0)
        if host > 0:
            tails.append(Event(i, -1, "host", end, end + host))
            end += host
        tails += _rest(plan, i, end)
    return sorted(events + tails, key=lambda e: (e.stage, e.start, e.kind))


def rest_parts(plan) -> dict:
    """{kind: seconds} of what the prediction sums that the schedule does not draw: the exposed
    communication other than p2p and the gradient sync (batch-norm statistics, the loss, resharding,
    tp / cp / ep collectives outside the stage figures) and the optimizer update."""
    pr = plan["predicted"]
    out = {k: float(v) for k, v in sorted((pr.get("comm_by_kind") or {}).items())
           if k not in DRAWN_COMM and isinstance(v, (int, float)) and v > 0}
    opt = float(pr.get("optimizer_s", 0.0) or 0.0)
    if opt > 0:
        out["optimizer"] = opt
    return out


def _rest(plan, stage, end) -> list:
    """Tails that take the row to the predicted step: the parts of rest_parts, each its share of the
    time the schedule leaves (the prediction overlaps some of them, so their sum may exceed it)."""
    step = float(plan["predicted"].get("step_time_s", 0.0) or 0.0)
    gap, parts = step - end, rest_parts(plan)
    total = sum(parts.values())
    if gap <= 1e-9 * step or total <= 0:
        return []
    out, t = [], end
    for k, v in parts.items():
        d = gap * v / total
        out.append(Event(stage, -1, "optimizer" if k == "optimizer" else "exposed", t, t + d))
        t += d
    return out


def _team_simulate(plan):
    """sapp.pipeline.schedule.simulate (the simulator the joint search is checked against) when it is
    importable; None when it is missing or refuses the inputs (then the local simulator runs)."""
    try:
        from ..pipeline.schedule import simulate  # type: ignore
    except Exception:
        return None
    f, b, rc, p2p, v, m = _stage_times(plan, per_device=True)
    schedule = plan["pipeline"].get("schedule", "none")
    if schedule == "none" or len(f) == 1:
        schedule, v = "1f1b", 1
    try:
        res = simulate(f, b, m, schedule, v=v, p2p_s=max(p2p) if p2p else 0.0, recompute_s=rc)
        return normalise_events(res.events) or None
    except Exception:
        return None
