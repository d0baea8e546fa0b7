"""`sapp evaluate plan.json --model NAME [--cluster SPEC]`: re-score a (hand-edited) plan.  A mixed
cluster's plan (data mode) is re-priced group by group plus the sync between them (hetero_plan.evaluate)."""
from __future__ import annotations

from ..units import fmt_bytes, fmt_time
from ._model import add_model_arguments, model_spec


def add_arguments(p):
    p.add_argument("plan", help="plan JSON file")
    add_model_arguments(p, default_help=" (default: the plan's model)")
    p.add_argument("--trust-plan-model", dest="trust_plan_model", action="store_true",
                   help="import and call the plan's pkg.module:factory model (never done by default: a plan is data)")
    p.add_argument("--cluster", help="cluster spec (default: the plan's cluster)")
    p.add_argument("--json", action="store_true", help="print the scores as JSON")


def run(args):
    from .. import api
    from ..plan import load_any
    kind, plan = load_any(args.plan)
    if kind == "mixed":
        return _mixed(args, plan)
    model = model_spec(args, default=plan["model"].get("name"))
    # the model the plan names is built with the settings it was searched with (--seq, --model-arg)
    settings = None if (args.model or args.hf_config) else (plan["model"].get("args") or None)
    res = api.evaluate(model, args.cluster, plan, model_args=settings)
    if args.json:
        import json
        print(json.dumps(res, indent=1, sort_keys=True, default=float))
        return 0
    pr = plan["predicted"]
    print(f"plan      {args.plan}: {res['config']}")
    print(f"step      {fmt_time(res['step_time_s'])} (plan says {fmt_time(pr['step_time_s'])})  MFU {res['mfu']:.1%}")
    print(f"memory    peak {fmt_bytes(res['peak_memory_bytes'])} of {fmt_bytes(res['capacity_bytes'])} per device: "
          + ("fits" if res["fits"] else "DOES NOT FIT"))
    for s in res["stages"][:8]:
        print(f"  stage {s['index']}: {s['blocks']} blocks, fwd {fmt_time(s['fwd_s'])}, bwd {fmt_time(s['bwd_s'])}, "
              f"memory {fmt_bytes(s['memory_bytes'])}")
    for n in res.get("notes", []):
        print(f"  - {n}")
    return 0 if res["fits"] else 1


def _mixed(args, doc):
    from sapp.api import mixed as hetero_plan
    from sapp.plan.mixed import group_plan, used_groups
    model = model_spec(args, default=doc["model"]["name"])
    # the model the plan names is built with the settings its groups were searched with
    first = group_plan(doc, used_groups(doc)[0])["model"]
    settings = None if (args.model or args.hf_config) else (first.get("args") or None)
    res = hetero_plan.evaluate(doc, model, args.cluster, model_args=settings)
    if args.json:
        import json
        print(json.dumps(res, indent=1, sort_keys=True, default=float))
        return 0 if res["fits"] else 1
    if res["mode"] == "pipeline":
        return _mixed_pipeline(args, doc, res)
    print(f"plan      {args.plan}: mixed cluster {doc['cluster'].get('name')}, {len(res['groups'])} data-parallel groups")
    for g in res["groups"]:
        print(f"  group {g['name']}: share {g['batch_share']}/{doc['model']['global_batch']}, {g['config']}: step "
              f"{fmt_time(g['step_time_s'])} (plan says {fmt_time(g['plan_step_time_s'])}), peak "
              f"{fmt_bytes(g['peak_memory_bytes'])} of {fmt_bytes(g['capacity_bytes'])}: "
              + ("fits" if g["fits"] else "DOES NOT FIT"))
    print(f"  cross-group gradient all-reduce {fmt_time(res['cross_group_sync_s'])}")
    print(f"step      {fmt_time(res['step_time_s'])} (plan says {fmt_time(res['plan_step_time_s'])}), the slowest group "
          f"plus the sync: {res['samples_per_s']:.4g} samples/s")
    return 0 if res["fits"] else 1


def _mixed_pipeline(args, doc, res) -> int:
    print(f"plan      {args.plan}: mixed cluster {doc['cluster'].get('name')}, a pipeline of {len(res['stages'])} "
          "stages over its groups")
    for s in res["stages"]:
        print(f"  stage {s['index']} on {s['group']}: fwd {fmt_time(s['fwd_s'])}, bwd {fmt_time(s['bwd_s'])} per "
              f"micro-batch, memory {fmt_bytes(s['memory_bytes'])}")
    print(f"  sends over the link between groups {fmt_time(res['cross_group_send_s'])} per micro-batch, bubble "
          f"{fmt_time(res['bubble_s'])}")
    print(f"step      {fmt_time(res['step_time_s'])} (plan says {fmt_time(res['plan_step_time_s'])}): "
          f"{res['samples_per_s']:.4g} samples/s; peak {fmt_bytes(res['peak_memory_bytes'])} of "
          f"{fmt_bytes(res['capacity_bytes'])}: " + ("fits" if res["fits"] else "DOES NOT FIT"))
    return 0 if res["fits"] else 1
