"""`explain` and `diff` of any plan, a mixed cluster's included (a plan with `groups`: sapp.plan.load_any's "mixed").

A plan of one device kind is one group: the group named after its cluster, whose plan is the plan.
A mixed plan's groups each run an ordinary plan: in data mode its own (at its share of the batch,
on its devices), in pipeline mode the pipeline's one plan, whose stages sit on the groups.  So
explain shows the mixed summary and then each group's plan explained as any plan is; diff compares
the overall figures (step, throughput, what crosses between groups) and each group's part, then
the ordinary field-by-field diff of each group's plan with its counterpart on the other side (the
same-named group, or the other side's only plan)."""
from __future__ import annotations

from ..plan import Plan
from sapp.plan.mixed import describe, group_plan, inner, members, mode, used_groups
from .diff import diff, row_adder, table
from .explain import explain
from .mixed_summary import summary


def explain_mixed(doc) -> str:
    out = [summary(doc).rstrip("\n")]
    gb = doc["model"]["global_batch"]
    if mode(doc) == "pipeline":
        out += ["", "the pipeline's plan (every rank runs it; each stage priced on its group's devices):",
                _indent(explain(Plan(inner(doc))))]
    else:
        for g in used_groups(doc):
            out += ["", f"group {g['name']}'s plan ({g['batch_share']} of the global batch {gb} on its "
                        f"{g['devices']} devices):", _indent(explain(Plan(g["plan"])))]
    return "\n".join(out) + "\n"


def _indent(text) -> str:
    return "\n".join(("  " + line) if line else line for line in text.rstrip("\n").split("\n"))


def _side(kind, doc):
    """{"kind", "cluster", "devices", "step", "rate", "cross", "model", "fingerprint", "gb", "parts":
    {group name: its part in words}, "plans": [(group name or None, plan dict)]} of either kind."""
    if isinstance(doc, Plan):
        doc = doc.to_dict()
    if kind == "plan":
        d = doc
        par, pr, gb = d["parallel"], d["predicted"], d["model"].get("global_batch")
        name = d["cluster"].get("name") or "cluster"
        return {"kind": "one device kind", "cluster": name, "devices": d["devices"], "step": pr.get("step_time_s"),
                "rate": gb / pr["step_time_s"] if gb and pr.get("step_time_s") else None, "cross": 0.0,
                "model": d["model"].get("name"), "fingerprint": d["model"].get("fingerprint"), "gb": gb,
                "parts": {name: f"{d['devices']} devices, {_layout(par)}"}, "plans": [(None, d)]}
    pr, gb = doc["predicted"], doc["model"]["global_batch"]
    parts = {}
    for g in members(doc):
        if mode(doc) == "pipeline":
            ix = [s["index"] for s in g["stages"]]
            parts[g["name"]] = (f"{g['devices']} devices, stage{'s' if len(ix) > 1 else ''} "
                                f"{ix[0] if len(ix) == 1 else f'{ix[0]}-{ix[-1]}'} "
                                f"({'/'.join(str(len(s['blocks'])) for s in g['stages'])} layers)")
        else:
            parts[g["name"]] = (f"{g['devices']} devices, share {g['batch_share']}/{gb}, {_layout(g['parallel'])}"
                                if g.get("batch_share") else f"{g['devices']} devices, unused")
    plans = ([("pipeline", inner(doc))] if mode(doc) == "pipeline"
             else [(g["name"], group_plan(doc, g)) for g in used_groups(doc)])
    return {"kind": f"mixed ({mode(doc)})", "cluster": doc["cluster"].get("name"), "devices": doc["devices"],
            "step": pr["step_time_s"], "rate": pr.get("samples_per_s"),
            "cross": pr.get("cross_group_sync_s", 0.0) + pr.get("cross_group_send_s", 0.0),
            "model": doc["model"]["name"], "fingerprint": doc["model"]["fingerprint"], "gb": gb,
            "parts": parts, "plans": plans, "describe": describe(doc)}


def _layout(par) -> str:
    return " ".join(f"{k}={par.get(k, 1)}" for k in ("dp", "tp", "pp", "cp", "ep")
                    if k in ("dp", "tp", "pp") or par.get(k, 1) > 1)


def diff_any(a, b, *, names=("A", "B")) -> str:
    """`a`, `b`: (kind, document) as sapp.plan.load_any returns them.  Two ordinary plans: their diff."""
    if a[0] == "plan" and b[0] == "plan":
        return diff(a[1], b[1], names=names)
    sa, sb = _side(*a), _side(*b)
    na, nb = names
    rows = []
    row = row_adder(rows)
    row("plan", sa["kind"], sb["kind"])
    row("model", sa["model"], sb["model"])
    if sa["fingerprint"] != sb["fingerprint"]:
        rows.append(("model fingerprint", sa["fingerprint"], sb["fingerprint"], "different models"))
    row("global batch", sa["gb"], sb["gb"])
    row("cluster", sa["cluster"], sb["cluster"])
    row("devices", sa["devices"], sb["devices"], ratio=True)
    for g in dict.fromkeys(list(sa["parts"]) + list(sb["parts"])):
        row(f"group {g}", sa["parts"].get(g), sb["parts"].get(g))
    row("step time", sa["step"], sb["step"], "time", ratio=True)
    row("throughput", sa["rate"], sb["rate"], "rate", ratio=True)
    row("between groups", sa["cross"], sb["cross"], "time")
    out = [table(rows, na, nb)]
    for label, pa, pb in _pairs(sa["plans"], sb["plans"]):
        la, lb = (f"{n} ({label[i]})" if label[i] else n for i, n in enumerate((na, nb)))
        out += ["", f"{la} vs {lb}: the plans they run", diff(pa, pb, names=(la, lb)).rstrip("\n")]
    lone = _unpaired(sa["plans"], sb["plans"])
    if lone:
        out += ["", "no counterpart to compare with: " + ", ".join(lone)]
    return "\n".join(out) + "\n"


def _pairs(pa, pb):
    """[((name in a, name in b), plan a, plan b)]: a side with one plan is every group's counterpart;
    otherwise groups are paired by name."""
    if len(pb) == 1:
        return [((n, pb[0][0]), p, pb[0][1]) for n, p in pa]
    if len(pa) == 1:
        return [((pa[0][0], n), pa[0][1], p) for n, p in pb]
    by = dict(pb)
    return [((n, n), p, by[n]) for n, p in pa if n in by]


def _unpaired(pa, pb) -> list:
    if len(pa) == 1 or len(pb) == 1:
        return []
    a, b = dict(pa), dict(pb)
    return [f"group {n} of the first" for n in a if n not in b] + [f"group {n} of the second" for n in b if n not in a]
