"""Plans over mixed clusters (a plan with a `groups` section, sapp/plan/mixed.py).  Mode "data": each group's assignment is an
ordinary plan of that group at its share of the global batch, plus what joins them (the cross-group
gradient sync) and the baselines the split has to beat.  Mode "pipeline": pipeline stages placed on
the groups (sapp/search/hetero_pipeline.py, the document in sapp/api/mixed_pipe.py).  `search`
prices both and keeps the faster (mode="auto"; a data-mode plan is then byte-identical to one
searched by the data mode alone).  Checked by sapp/plan/mixed.py; every command loads it with
sapp.plan.load_any."""
from __future__ import annotations

import json
import math

from sapp.errors import InfeasibleError, SappError
from sapp.plan import Plan
from sapp.plan.mixed import data_document, group_plan, mode as mode_of, used_groups
from sapp.report.mixed_summary import summary as explain  # noqa: F401 - mixed.explain, the summary search prints

MODES = ("auto", "data", "pipeline")


def _num(x):
    return None if x is None or not math.isfinite(x) else x


def search(model, mc, *, global_batch=None, constraints=None, precision=None, runtime=None, graph=None,
           exhaustive=False, q=None, example_inputs=None, mode="auto"):
    """(the hetero plan document (a dict) for `model` on the MixedCluster `mc`, timing).  `mode`: "auto"
    (the faster of the data and pipeline modes), "data" or "pipeline" (that mode only)."""
    import time
    from sapp import api
    from sapp.search.constraints import Constraints
    from sapp.costmodel import CostSettings
    from sapp.search import hetero
    cons = Constraints.from_dict(constraints)
    info, name = None, getattr(graph, "name", None) or "graph"
    if graph is None:
        if isinstance(model, str):
            _, name, info, graph, _ = api.capture_spec(model)
        else:
            module, name, info = api.resolve_model(model)
            graph, _ = api.capture_graph(module, example_inputs)
    gb = Constraints.check_global_batch(global_batch if global_batch is not None
                                        else api.default_global_batch(info, mc.devices))
    slow = mc.slowest()
    settings = CostSettings(precision=precision or slow.precision, runtime=runtime or "eager",
                            dropout_noise=not slow.fused_dropout)
    if mode not in MODES:
        raise SappError(f"mixed-cluster mode {mode!r}: use one of {', '.join(MODES)}")
    t0 = time.perf_counter()
    try:
        shares, step, d = hetero.search(graph, mc, global_batch=gb, constraints=cons, settings=settings,
                                        search_fn=api.tp_search_fn(), exhaustive=exhaustive, q=q)
    except InfeasibleError:
        if mode == "data":
            raise
        shares, step, d = None, math.inf, None
    pipe, why, timing_p = None, None, {}
    if mode != "data":
        from sapp.search import hetero_pipeline
        t1, c1 = time.perf_counter(), time.process_time()
        # auto: configurations that cannot beat the data mode are not priced (their step stays unknown)
        cutoff = step if mode == "auto" and d is not None else None
        pipe, why, n = hetero_pipeline.search(graph, mc, global_batch=gb, constraints=cons, settings=settings,
                                              search_fn=api.tp_search_fn(), cutoff=cutoff)
        pruned = pipe is None and cutoff is not None and why.startswith(hetero_pipeline.PRUNED)
        timing_p = {"pipeline_search_s": time.perf_counter() - t1, "pipeline_search_cpu_s": time.process_time() - c1,
                    "pipeline_configs": n, "pipeline_why": why, "pipeline_step_above_s": cutoff if pruned else None,
                    "pipeline_step_s": pipe.result.step_time_s if pipe else None, "data_step_s": _num(step)}
        if pipe is None and (mode == "pipeline" or d is None):
            raise InfeasibleError(f"no pipeline over the groups {', '.join(g.name for g in mc.groups)}: {why}"
                                  + ("" if d is not None or mode == "pipeline" else "; and no split of the batch fits"))
    if pipe is not None and (mode == "pipeline" or pipe.result.step_time_s < step):
        from sapp.api import mixed_pipe as hetero_pipe_plan
        if d is not None:
            alone, uni = {k: _num(v) for k, v in d["alone"].items()}, _num(d["uniform"])
        else:
            alone = {g.name: _num(hetero.GroupPricer(graph, mc, cons, settings, api.tp_search_fn()).time(i, gb))
                     for i, g in enumerate(mc.groups)}
            uni = _num(hetero.uniform_baseline(graph, mc, gb, cons, settings, api.tp_search_fn()))
        doc = hetero_pipe_plan.document(graph, mc, pipe, name=name, gb=gb, cons=cons, settings=settings,
                                        data_step=_num(step), alone=alone, uniform=uni)
        doc = Plan(doc).to_dict()
        return doc, dict(timing_p, search_s=time.perf_counter() - t0, evaluations=pipe.evaluations,
                         split_search_s=d["search_s"] if d else 0.0, split_search_cpu_s=d["search_cpu_s"] if d else 0.0)
    groups = []
    for g, (cl, b) in enumerate(zip(mc.groups, shares)):
        entry = {"name": cl.name, "devices": cl.devices, "batch_share": b}
        if b:
            res = d["pricer"].result(g, b)
            plan = api.build_plan(graph, cl, res, name=name, global_batch=b, constraints=cons, settings=settings)
            entry.update(parallel=dict(plan["parallel"]), step_time_s=res.step_time_s, plan=plan.to_dict())
        groups.append(entry)
    doc = data_document(
        {"name": name, "fingerprint": graph.fingerprint(), "params": graph.param_count(),
         "flops_per_sample": graph.flops_per_sample(), "global_batch": gb},
        mc.to_dict(), mc.devices, groups,
        {"step_time_s": step, "cross_group_sync_s": d["sync_s"], "samples_per_s": gb / step},
        {"alone": {k: _num(v) for k, v in d["alone"].items()}, "uniform_slowest": _num(d["uniform"])},
        [f"batch split in quanta of {d['quantum']} samples; gradients weighted by share / global batch "
         f"and summed over all ranks"])
    doc = Plan(doc).to_dict()       # checked and rounded as every plan is
    doc_timing = {"search_s": time.perf_counter() - t0, "split_search_s": d["search_s"],
                  "split_search_cpu_s": d["search_cpu_s"], "evaluations": d["evaluations"], **timing_p}
    return doc, doc_timing


def dumps(doc) -> str:
    """The plan's JSON as Plan.save writes it (a dict or a Plan)."""
    return doc.to_json() if isinstance(doc, Plan) else json.dumps(doc, indent=1, sort_keys=True) + "\n"


def check(doc):
    """A mixed plan's document checked as Plan checks every plan (schema, groups, the pp plan's fields)."""
    Plan(doc if isinstance(doc, dict) else doc.to_dict())
    return doc


def evaluate(doc, model, cluster=None, *, model_args=None) -> dict:
    """Re-price a data-mode mixed plan: each group's own plan on its group (api.evaluate, the model
    captured once), then the cross-group gradient sync over the link, as the search sums them: the
    step is the slowest group's plus the sync.  `cluster`: a mixed spec or file whose groups are the
    plan's (the plan's own cluster by default).  A pipeline-mode plan is re-priced on its stages as they
    are, each on its group (`_evaluate_pipeline`)."""
    from sapp import api
    from sapp.cluster.groups import MixedCluster, parse
    from sapp.costmodel import CostSettings
    from sapp.search import hetero
    mc = parse(cluster) if cluster is not None else MixedCluster.from_dict(doc["cluster"], where="plan's cluster section: ")
    if not isinstance(mc, MixedCluster):
        raise SappError(f"--cluster {cluster} is one kind of device; a mixed plan is priced on its groups: give a "
                        f"spec of its groups ({' + '.join(g['name'] for g in doc['groups']['members'])}) or drop --cluster")
    groups = used_groups(doc)
    index = {g.name: i for i, g in enumerate(mc.groups)}
    lost = [g["name"] for g in groups if g["name"] not in index]
    if lost:
        raise SappError(f"the cluster has no group {lost[0]!r} (its groups: {', '.join(index)}); name the groups "
                        "as the plan does, or search the plan again for this cluster")
    module, name, _ = api.resolve_model(model, model_args=model_args)
    graph, _ = api.capture_graph(module)
    if mode_of(doc) == "pipeline":
        return _evaluate_pipeline(doc, graph, mc, index)
    parts = []
    for g in groups:
        r = api.evaluate(name, mc.groups[index[g["name"]]], Plan(g["plan"]), graph=graph)
        parts.append({"name": g["name"], "batch_share": g["batch_share"], "plan_step_time_s": g["step_time_s"], **r})
    st = groups[0]["plan"].get("settings") or {}
    sync = hetero.sync_s(graph, mc, CostSettings(precision=st.get("precision", mc.slowest().precision)),
                         [index[g["name"]] for g in groups])
    step = max(p["step_time_s"] for p in parts) + sync
    return {"mode": "data", "step_time_s": step, "plan_step_time_s": doc["predicted"]["step_time_s"],
            "cross_group_sync_s": sync, "samples_per_s": doc["model"]["global_batch"] / step,
            "fits": all(p["fits"] for p in parts), "groups": parts}


def _evaluate_pipeline(doc, graph, mc, index) -> dict:
    """Re-price a pipeline-mode mixed plan on its stages as they are (each on its group, the sends over
    the link between groups), as its search priced them (hetero_pipeline.price_given)."""
    from sapp import api
    from sapp.costmodel import CostSettings
    from sapp.search.constraints import Constraints
    from sapp.search import hetero_pipeline
    from sapp.search.joint.result import Config
    from sapp.plan.mixed import members, pipe
    p, st = pipe(doc), doc.get("settings") or {}
    cfg = Config(p["stages"], p["stage_width"], 1, p["micro_batches"], p["micro_batch_size"], p["schedule"], 1,
                 p["zero"])
    order = [index[g["name"]] for g in members(doc) for _ in g["stages"]]
    units = [list(s["units"]) for g in members(doc) for s in g["stages"]]
    slow = mc.slowest()
    settings = CostSettings(precision=st.get("precision") or slow.precision, runtime=st.get("runtime") or "eager",
                            dropout_noise=not slow.fused_dropout)
    r = hetero_pipeline.price_given(graph, mc, global_batch=doc["model"]["global_batch"],
                                    constraints=Constraints.from_dict(doc.get("constraints") or None), settings=settings,
                                    search_fn=api.tp_search_fn(), cfg=cfg, order=order, stage_units=units)
    res, step = r.result, r.result.step_time_s
    return {"mode": "pipeline", "step_time_s": step, "plan_step_time_s": doc["predicted"]["step_time_s"],
            "cross_group_send_s": sum(f + b for f, b in r.link_s), "bubble_s": res.bubble_s,
            "samples_per_s": doc["model"]["global_batch"] / step,
            "peak_memory_bytes": res.peak_memory_bytes, "capacity_bytes": res.capacity_bytes,
            "fits": res.peak_memory_bytes <= res.capacity_bytes,
            "stages": [{"index": i, "group": mc.groups[g].name, "fwd_s": s.fwd_s, "bwd_s": s.bwd_s,
                        "memory_bytes": s.memory_bytes} for i, (g, s) in enumerate(zip(order, res.stages))]}


def replan(doc, model, cluster) -> tuple:
    """(lines to print, the new document: a mixed plan's dict, or a Plan for one kind) re-planning the
    mixed plan `doc` for `cluster` (a spec or file) with its model, global batch, precision, runtime
    and pins: a mixed cluster is searched as `sapp search --cluster A+B` does (both modes, the faster
    kept); a cluster of one kind re-plans the plan one group's ranks run (sapp/api/replan.py)."""
    import time
    from sapp.cluster.groups import MixedCluster, parse
    from sapp.emit.runtime.hetero_run import rank_plan
    from sapp.plan.mixed import describe
    from sapp.api.replan import replan as replan_one
    groups = used_groups(doc)
    inner = group_plan(doc, groups[0])
    st = inner.get("settings") or {}
    old = f"old: mixed plan ({describe(doc)}) on {doc['devices']} devices: {doc['predicted']['step_time_s']:.4g} s/step"
    mc = parse(cluster)
    if not isinstance(mc, MixedCluster):
        r = replan_one(model, rank_plan(doc, groups[0]["name"], sum(g["devices"] for g in groups)), mc)
        return [old] + r.lines()[1:], r.plan
    t0 = time.perf_counter()
    new, _ = search(model, mc, global_batch=doc["model"]["global_batch"], constraints=inner.get("constraints") or None,
                    precision=st.get("precision"), runtime=st.get("runtime"))
    t, was = new["predicted"]["step_time_s"], doc["predicted"]["step_time_s"]
    return [old, f"new: mixed plan ({describe(new)}) on {new['devices']} devices: {t:.4g} s/step ({t / was - 1:+.1%}), "
                 f"searched in {time.perf_counter() - t0:.1f} s"], new
