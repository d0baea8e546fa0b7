"""`diff(a, b) -> str`: two plans side by side, field by field, with ratios for predicted figures and a
summary of how their operator layouts differ."""
from __future__ import annotations

from ..units import fmt_bytes, fmt_time
from ._common import as_plan, get, opt, placement_label, recompute_label, stage_memory, throughput


def _ratio(a, b):
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return ""
    if a == 0:
        return "" if b == 0 else "new"
    return f"x{b / a:.3f}"


def _fmt(v, kind):
    if v is None:
        return "-"
    if kind == "time":
        return fmt_time(v)
    if kind == "bytes":
        return fmt_bytes(v)
    if kind == "pct":
        return f"{100 * float(v):.1f}%"
    if kind == "rate":
        return f"{float(v):,.1f}/s"
    return str(v)


def split_degrees(split, levels) -> dict:
    """{op dim: ways it is split} from a per-level split tuple and the plan's mesh levels.  Two plans
    with different meshes are compared on this, not on the raw tuples."""
    out = {}
    for i, dim in enumerate(split or []):
        if dim is None:
            continue
        size = int(levels[i]["size"]) if i < len(levels) else 1
        out[dim] = out.get(dim, 1) * size
    return out


def layout_changes(a, b) -> dict:
    """Operator layout differences: {"changed": [(node, kind, module, degrees_a, degrees_b)], "only_a": [...],
    "only_b": [...]}; degrees are {dim: ways}."""
    oa, ob = a["operators"] or {}, b["operators"] or {}
    la, lb = get(a["mesh"], "levels", default=[]) or [], get(b["mesh"], "levels", default=[]) or []
    changed = []
    for node in sorted(set(oa) & set(ob)):
        da, db = split_degrees(oa[node].get("split"), la), split_degrees(ob[node].get("split"), lb)
        if da != db:
            changed.append((node, oa[node].get("kind", "?"), oa[node].get("module", ""), da, db))
    return {"changed": changed, "only_a": sorted(set(oa) - set(ob)), "only_b": sorted(set(ob) - set(oa))}


def _split_str(deg):
    return "{" + ",".join(f"{d}/{n}" for d, n in sorted(deg.items())) + "}" if deg else "replicated"


# what a plan states about how it trains that changes its price, beyond the parallel degrees
SETTINGS = (("precision", "fp32"), ("runtime", "eager"), ("optimizer", "adam"), ("grad_sync_overlap_rule", "none"),
            ("grad_fp32", False), ("moe_imbalance", 1.0), ("recompute_modules", None))


def _layout_rows(a, b, row):
    """Every degree (cp, ep and sp are left out of a plan where they are off), the pipeline, the
    recomputation block by block, ZeRO and placement."""
    for k, off in (("dp", 1), ("tp", 1), ("pp", 1), ("cp", 1), ("ep", 1), ("sp", False)):
        va, vb = a["parallel"].get(k, off), b["parallel"].get(k, off)
        row(k, va, vb, ratio=va != vb and k != "sp")
    for k in ("schedule", "micro_batches", "micro_batch_size", "virtual_chunks", "scatter_gather"):
        row(f"pipeline.{k}", a["pipeline"].get(k), b["pipeline"].get(k))
    sa = [tuple(s.get("blocks") or []) for s in sorted(a["pipeline"].get("stages") or [], key=lambda s: s.get("index", 0))]
    sb = [tuple(s.get("blocks") or []) for s in sorted(b["pipeline"].get("stages") or [], key=lambda s: s.get("index", 0))]
    row("stage sizes (blocks)", "/".join(str(len(s)) for s in sa) or "-", "/".join(str(len(s)) for s in sb) or "-")
    row("recompute", recompute_label(a), recompute_label(b))
    ra, rb = a["recompute"] or {}, b["recompute"] or {}
    blocks = sorted(set(ra.get("blocks") or {}) | set(rb.get("blocks") or {}))
    differ = [k for k in blocks if (ra.get("blocks") or {}).get(k, ra.get("default")) !=
              (rb.get("blocks") or {}).get(k, rb.get("default"))]
    if differ:
        ex = ", ".join(f"{k}: {(ra.get('blocks') or {}).get(k, ra.get('default'))} -> "
                       f"{(rb.get('blocks') or {}).get(k, rb.get('default'))}" for k in differ[:3])
        row("recompute by block", f"{len(differ)} blocks differ", ex + (f", ... (+{len(differ) - 3})" if len(differ) > 3 else ""))
    row("zero", a["zero"], b["zero"])
    row("placement", placement_label(a), placement_label(b))


def _setting_rows(a, b, row):
    sa, sb = opt(a, "settings", {}) or {}, opt(b, "settings", {}) or {}
    for k, default in SETTINGS:
        row(f"settings.{k}", sa.get(k, default), sb.get(k, default))
    ca, cb = a["cluster"], b["cluster"]
    figures = sorted(k for k in set(ca) | set(cb) if k not in ("name", "nodes", "notes") and ca.get(k) != cb.get(k))
    if figures and ca.get("name") == cb.get("name"):       # same preset name, other figures (a calibration)
        row("cluster figures", "", f"{len(figures)} differ: " + ", ".join(figures[:4]) + (" ..." if len(figures) > 4 else ""))


def _predicted_rows(a, b, row):
    pa, pb = a["predicted"], b["predicted"]
    row("step time", pa.get("step_time_s"), pb.get("step_time_s"), "time", ratio=True)
    row("throughput", throughput(a), throughput(b), "rate", ratio=True)
    row("MFU", pa.get("mfu"), pb.get("mfu"), "pct", ratio=True)
    for k, label in (("compute_s", "compute"), ("comm_s", "communication"), ("bubble_s", "bubble"), ("host_s", "host")):
        if pa.get(k) is not None or pb.get(k) is not None:
            row(label, pa.get(k), pb.get(k), "time", ratio=True)
    row("peak memory", pa.get("peak_memory_bytes"), pb.get("peak_memory_bytes"), "bytes", ratio=True)
    ma, mb = pa.get("memory") or {}, pb.get("memory") or {}
    for k in sorted(set(ma) | set(mb)):
        row(f"memory.{k}", ma.get(k), mb.get(k), "bytes", ratio=True)
    sma, smb = stage_memory(a), stage_memory(b)
    if len(sma) > 1 or len(smb) > 1:        # one aligned row per stage (a plan may have fewer stages)
        for i in range(max(len(sma), len(smb))):
            row(f"stage {i} memory", sma[i][1] if i < len(sma) else None, smb[i][1] if i < len(smb) else None,
                "bytes", ratio=True)


def diff(a, b, *, names=("A", "B"), max_ops=12) -> str:
    """Two plans side by side: every field that changes the price (the whole parallel layout, the
    pipeline, recomputation block by block, ZeRO, placement, precision and runtime profile), then
    the predicted figures with their ratios, then how the operator layouts differ."""
    a, b = as_plan(a), as_plan(b)
    na, nb = names
    rows = []   # (field, a, b, note)
    row = row_adder(rows)

    row("model", a["model"].get("name"), b["model"].get("name"))
    if a["model"].get("fingerprint") != b["model"].get("fingerprint"):
        rows.append(("model fingerprint", a["model"].get("fingerprint"), b["model"].get("fingerprint"), "different models"))
    row("global batch", a["model"].get("global_batch"), b["model"].get("global_batch"))
    row("sequence", (a["model"].get("meta") or {}).get("seq"), (b["model"].get("meta") or {}).get("seq"))
    row("cluster", a["cluster"].get("name"), b["cluster"].get("name"))
    row("devices", a["devices"], b["devices"])
    _layout_rows(a, b, row)
    _setting_rows(a, b, row)
    _predicted_rows(a, b, row)
    return table(rows, na, nb) + _operator_lines(a, b, na, nb, max_ops)


def row_adder(rows):
    """row(field, a, b, kind="", ratio=False): one row of `rows` with both values formatted by `kind`
    (time, bytes, pct, rate) and its change (the ratio b / a where `ratio`)."""
    def row(field, va, vb, kind="", ratio=False):
        note = ("" if va == vb else _ratio(va, vb) or "changed") if ratio else ("" if va == vb else "changed")
        rows.append((field, _fmt(va, kind), _fmt(vb, kind), note))
    return row


def table(rows, na, nb) -> str:
    """(field, a, b, change) rows aligned in columns, a `*` where the values differ."""
    w0 = max(len(r[0]) for r in rows)
    w1 = max(max(len(str(r[1])) for r in rows), len(na))
    w2 = max(max(len(str(r[2])) for r in rows), len(nb))
    out = [f"{'field':<{w0}}  {na:<{w1}}  {nb:<{w2}}  change", "-" * (w0 + w1 + w2 + 14)]
    for f, va, vb, note in rows:
        mark = "*" if va != vb else " "
        out.append(f"{f:<{w0}}  {va:<{w1}}  {vb:<{w2}} {mark}{note}")
    return "\n".join(out) + "\n"


def _operator_lines(a, b, na, nb, max_ops) -> str:
    out = []
    lc = layout_changes(a, b)
    na_ops, nb_ops = len(a["operators"] or {}), len(b["operators"] or {})
    out.append("")
    out.append(f"Operator layouts (dim/ways each operator is split over its stage's devices): {len(lc['changed'])} of {len(set(a['operators'] or {}) & set(b['operators'] or {}))} "
               f"shared operators differ ({na_ops} in {na}, {nb_ops} in {nb})")
    if lc["changed"]:
        by_kind = {}
        for _, kind, _, _, _ in lc["changed"]:
            by_kind[kind] = by_kind.get(kind, 0) + 1
        out.append("  by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items())))
        # Repeated blocks usually change the same way: group by (kind, split change) to keep it short.
        groups = {}
        for node, kind, module, s1, s2 in lc["changed"]:
            groups.setdefault((kind, _split_str(s1), _split_str(s2)), []).append(module or node)
        for (kind, s1, s2), mods in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:max_ops]:
            ex = ", ".join(mods[:3]) + (f", ... (+{len(mods) - 3})" if len(mods) > 3 else "")
            out.append(f"  {kind:<11} {s1} -> {s2}  x{len(mods)}: {ex}")
    if lc["only_a"] or lc["only_b"]:
        out.append(f"  only in {na}: {len(lc['only_a'])} operators; only in {nb}: {len(lc['only_b'])} operators")
    ta, tb = opt(a, "tp_modules", {}), opt(b, "tp_modules", {})
    tp_changed = sorted(k for k in set(ta) | set(tb) if ta.get(k) != tb.get(k))
    if tp_changed:
        out.append(f"  tensor-parallel module styles differ on {len(tp_changed)} modules, e.g. "
                   + ", ".join(f"{k}: {ta.get(k, '-')} -> {tb.get(k, '-')}" for k in tp_changed[:4]))
    return "\n".join(out) + "\n"
