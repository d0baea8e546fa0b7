"""The pipeline mode of a mixed cluster's plan (groups.mode "pipeline", sapp/plan/mixed.py): the plan
of a pipeline whose stages sit on the groups (sapp/search/hetero_pipeline.py).

The document is the ordinary pp plan every rank runs (sapp run), its stages numbered in group order,
with the mixed cluster as its cluster and the mixed predictions; its `groups` section states each
group's stages (their blocks and units, per-micro-batch times as priced on the group's devices, the
sends over the link between groups) and the baselines."""
from __future__ import annotations



def document(graph, mc, pipe, *, name, gb, cons, settings, data_step, alone, uniform):
    from sapp.api import build_plan
    from sapp.plan.mixed import pipeline_document
    from sapp.search.hetero import uniform_cluster
    res, cfg = pipe.result, pipe.config
    inner = build_plan(graph, uniform_cluster(mc), res, name=name, global_batch=gb, constraints=cons,
                       settings=settings).to_dict()
    inner["notes"] = inner.get("notes", []) + [
        "stages on a mixed cluster's groups: " + ", ".join(
            f"{mc.groups[g].name} {_span([i for i, o in enumerate(pipe.order) if o == g])}"
            for g in dict.fromkeys(pipe.order)) + "; times priced on each stage's group (the mixed plan)"]
    groups = []
    for g in dict.fromkeys(pipe.order):          # in stage order: a group's ranks follow the one before
        cl = mc.groups[g]
        mine = [res.stages[i] for i, o in enumerate(pipe.order) if o == g]
        groups.append({"name": cl.name, "devices": cl.devices, "stages": [
            {"index": st.index, "blocks": list(st.blocks), "units": list(st.units), "fwd_s": st.fwd_s,
             "bwd_s": st.bwd_s, "send_s": st.send_s, "link_send_s": list(pipe.link_s[st.index]),
             "memory_bytes": st.memory_bytes} for st in mine]})
    cross = sum(f + b for f, b in pipe.link_s)
    inner["model"] = dict(inner["model"], name=name, global_batch=gb)
    return pipeline_document(
        inner, mc.to_dict(), groups, {"cross_group_sync_s": 0.0, "cross_group_send_s": cross},
        {"alone": alone, "uniform_slowest": uniform, "data_mode": data_step},
        [f"pipeline of {cfg.pp} stages x {cfg.dp} devices over the groups in the order listed; stage boundaries "
         "between groups send over the link between them; every rank runs the plan at the top (its stages the "
         "groups')"])


def _span(ix) -> str:
    return f"stage {ix[0]}" if len(ix) == 1 else f"stages {ix[0]}-{ix[-1]}"
