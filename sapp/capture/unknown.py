"""What capture does not know, said out loud: ops no handler recognised (priced at one FLOP per output
element, only batch dims splittable) with their share of the step's FLOPs and bytes.  Stored in
`graph.meta["unknown_ops"]`; the plan's notes and `sapp explain` print it."""
from __future__ import annotations


def unknown_ops(graph) -> list:
    """[{op, count, flops_share, bytes_share, modules}] for every unknown op target, largest FLOP
    share first.  Shares are of the captured forward (the backward scales alike)."""
    total_f = sum(n.flops for n in graph.nodes.values()) or 1.0
    total_b = sum(n.bytes for n in graph.nodes.values()) or 1.0
    rows = {}
    for n in graph.nodes.values():
        if not n.extra.get("generic"):
            continue
        r = rows.setdefault(n.target, {"op": n.target, "count": 0, "flops": 0.0, "bytes": 0.0, "modules": []})
        r["count"] += 1
        r["flops"] += n.flops
        r["bytes"] += n.bytes
        if n.module and n.module not in r["modules"] and len(r["modules"]) < 3:
            r["modules"].append(n.module)
    out = [{"op": r["op"], "count": r["count"], "flops_share": r["flops"] / total_f,
            "bytes_share": r["bytes"] / total_b, "modules": r["modules"]} for r in rows.values()]
    return sorted(out, key=lambda r: (-r["flops_share"], r["op"]))


def unknown_note(rows) -> str | None:
    """One plan note naming every unknown op, or None when capture knew them all."""
    if not rows:
        return None
    parts = [f"{r['op']} x{r['count']} ({100 * r['flops_share']:.3g}% of FLOPs, {100 * r['bytes_share']:.3g}% of bytes"
             + (f", in {r['modules'][0]}" if r["modules"] else "") + ")" for r in rows]
    share = sum(r["flops_share"] for r in rows)
    return (f"unknown ops, priced at 1 FLOP per output element and split only along the batch "
            f"({100 * share:.3g}% of the step's FLOPs): " + "; ".join(parts))
