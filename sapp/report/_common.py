"""Small helpers shared by explain / diff / plot: reading optional plan fields safely."""
from __future__ import annotations

from ..plan import Plan


def as_plan(plan):
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, dict):
        return Plan(plan)
    return Plan.load(plan)


def get(d, *path, default=None):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def capacity(plan):
    """Usable bytes per device: the search's own figure (device memory less its reserve) when the plan
    records it, else the cluster's device memory."""
    cap = plan["predicted"].get("capacity_bytes")
    return float(cap) if cap else float(get(plan["cluster"], "device_memory", default=0.0) or 0.0)


def throughput(plan):
    gb = get(plan["model"], "global_batch")
    st = plan["predicted"].get("step_time_s") or 0
    return (gb / st) if gb and st else None


def recompute_label(plan):
    rc = plan["recompute"] or {}
    blocks = rc.get("blocks") or {}
    default = rc.get("default", "none")
    if not blocks:
        return default
    counts = {}
    for v in blocks.values():
        counts[v] = counts.get(v, 0) + 1
    parts = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))
    return f"{default} (per block: {parts})"


def placement_label(plan):
    groups = get(plan["placement"], "groups", default={}) or {}
    host = []
    for name in sorted(groups):
        g = groups[name]
        where = sorted(k for k in ("weights", "grads", "optimizer") if g.get(k) == "host")
        if where:
            host.append(f"{name}[{'/'.join(where)}]")
    return "all on device" if not host else "host: " + ", ".join(host)


def stage_memory(plan):
    """[(stage index, total bytes, breakdown dict or None)] — per stage when the plan has it, else one
    row from predicted.peak_memory_bytes / predicted.memory."""
    stages = sorted(get(plan["pipeline"], "stages", default=[]) or [], key=lambda s: s.get("index", 0))
    rows, seen = [], set()
    for s in stages:
        # interleaved plans list one entry per virtual stage; each carries its device's total
        dev = int(s.get("device_stage", s.get("index", len(rows))))
        if dev in seen:
            continue
        seen.add(dev)
        pr = s.get("predicted") or {}
        bd = pr.get("memory") if isinstance(pr.get("memory"), dict) else None
        total = pr.get("memory_bytes")
        if total is None and bd:
            total = sum(bd.values())
        if total is not None:
            rows.append((dev, float(total), bd))
    if rows:
        return sorted(rows, key=lambda r: r[0])
    bd = plan["predicted"].get("memory") if isinstance(plan["predicted"].get("memory"), dict) else None
    return [(0, float(plan["predicted"].get("peak_memory_bytes") or 0.0), bd)]


def opt(plan, key, default=None):
    """An optional top-level plan field (alternatives, notes, constraints, tp_modules)."""
    try:
        v = plan[key]
    except KeyError:
        return default
    return default if v is None else v
