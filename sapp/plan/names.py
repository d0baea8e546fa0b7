"""Every name a plan gives must be a name of the captured model: a plan whose stages list a block the
model lacks, whose tp_modules or placement name a module or table it does not have, was made for
another model or edited by hand, and re-scoring it while skipping those names prices something
else than the plan says (the emitter refuses the same names at run time: sapp/emit/checks/plan.py)."""
from __future__ import annotations

import fnmatch

from sapp.errors import PlanError


def module_names(graph) -> set:
    """Qualified names of the model's modules the graph saw: every operator's module, its parents,
    and every parameter's owner ("" is the root)."""
    out = {""}
    owners = [n.module or "" for n in graph.nodes.values()] + [p.rpartition(".")[0] for p in graph.params]
    for name in owners:
        parts = name.split(".") if name else []
        for i in range(1, len(parts) + 1):
            out.add(".".join(parts[:i]))
    return out


def _unknown(what, name, known, hint):
    shown = name if len(name) <= 80 else name[:77] + "..."
    raise PlanError(f"{what} names {shown!r}, which this model does not have (it has e.g. "
                    f"{', '.join(sorted(known, key=lambda k: (len(k), k))[:3]) or 'none'}); {hint}")


def check_plan_names(plan, graph) -> None:
    """Raise PlanError naming the first stage block, split point, recompute block, operator, tp
    module or placement group of `plan` that matches nothing in `graph`."""
    d = plan._d
    blocks, mods = set(graph.blocks), module_names(graph)
    fix = "fix the plan or regenerate it with `sapp search` for this model"
    for i, st in enumerate(d["pipeline"].get("stages") or []):
        for b in st.get("blocks") or []:
            if b not in blocks:
                _unknown(f"pipeline.stages[{i}].blocks", b, blocks, fix)
        sb = st.get("split_before")
        if isinstance(sb, str) and sb and sb not in mods:
            _unknown(f"pipeline.stages[{i}].split_before", sb, blocks, fix)
    for b in sorted((d["recompute"] or {}).get("blocks") or {}):
        if b not in blocks and not any(fnmatch.fnmatchcase(x, b) for x in blocks):
            _unknown("recompute.blocks", b, blocks, fix)
    for name in sorted(d["operators"]):
        if name not in graph.nodes:
            _unknown("operators", name, graph.nodes, fix)
    for name in sorted(d.get("tp_modules") or {}):
        if name not in mods:
            _unknown("tp_modules", name, mods - {""}, fix)
    for gi, group in enumerate((d.get("tp_layout") or {}).get("groups") or []):
        for name in (group if isinstance(group, list) else []):
            if isinstance(name, str) and name not in mods:
                _unknown(f"tp_layout.groups[{gi}]", name, mods - {""}, fix)
    parts = (d.get("tp_layout") or {}).get("parts")
    for name in sorted(parts if isinstance(parts, dict) else {}):
        if name not in mods:
            _unknown("tp_layout.parts", name, mods - {""}, fix)
    params = [p for p, info in graph.params.items() if info.trainable]
    for key in sorted(((d.get("placement") or {}).get("groups") or {})):
        if key not in params and not any(fnmatch.fnmatchcase(p, key) for p in params):
            _unknown("placement.groups", key, params, fix)
