"""`sapp replan PLAN --nodes N | --devices N | --cluster SPEC`: what a job running PLAN becomes on
another number of nodes (sapp/api/replan.py): the new layout, both predicted step times, the search time,
the pins that had to go.  The same re-plan `sapp run --elastic` makes when nodes leave or join."""
from __future__ import annotations

from ._model import add_model_arguments, model_spec


def add_arguments(p):
    p.add_argument("plan", help="plan JSON file")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--nodes", type=int, help="nodes left (or added): the plan's cluster with this many nodes")
    size.add_argument("--devices", type=int, help="devices left: whole nodes of the plan's cluster, or one partial node")
    size.add_argument("--cluster", help="a cluster spec or file to re-plan for")
    add_model_arguments(p, default_help=" (default: the plan's model)")
    p.add_argument("--trust-plan-model", dest="trust_plan_model", action="store_true",
                   help="import and call the plan's pkg.module:factory model (never done by default: a plan is data)")
    p.add_argument("--out", help="write the new plan here")
    p.add_argument("--full", action="store_true",
                   help="write the operators map inside the plan file (default: beside it, PLAN.operators.json, "
                        "so the plan stays short enough to read; every command reads the pair as one plan)")


def run(args):
    from .. import api
    from ..plan import load_any
    from sapp.api.replan import replan, scaled_cluster
    from ._paths import check_out, written_beside
    if args.out:
        check_out(args.out)
    kind, plan = load_any(args.plan)
    if kind == "mixed":
        return _mixed(args, plan)
    model = model_spec(args, default=plan["model"].get("name"))
    cluster = (api.resolve_cluster(args.cluster) if args.cluster
               else scaled_cluster(plan, nodes=args.nodes, devices=args.devices))
    from ..report.progress import LOG_EVERY, Progress
    # a re-plan captures the model and searches every node count (seconds to a minute): a bar, or log lines
    with Progress(label="replan", counts=False, log_every=LOG_EVERY) as prog:
        prog.status(f"re-planning {model} for {cluster.devices} devices ({cluster.name})")
        prog.ticking()
        r = replan(model, plan, cluster)
    for line in r.lines():
        print(line)
    if args.out:
        r.plan.save(args.out, operators_beside=not args.full)
        print(f"plan written to {args.out}" + written_beside(args))
    return 0


def _mixed(args, doc):
    """A mixed plan re-planned for the cluster given (--cluster); its nodes are counted per group, so a
    bare --nodes or --devices says nothing of which group lost or gained them."""
    from sapp.api import mixed as hetero_plan
    from ..errors import UsageError
    from ..plan import Plan
    from sapp.plan.mixed import cluster_spec
    if not args.cluster:
        flag = f"--nodes {args.nodes}" if args.nodes is not None else f"--devices {args.devices}"
        raise UsageError(f"{flag}: a mixed plan's nodes are counted per group ({cluster_spec(doc)}); give --cluster "
                         "with each group's nodes (a spec like that, or a cluster file), or one kind's spec to re-plan "
                         "onto it")
    model = model_spec(args, default=doc["model"]["name"])
    lines, new = hetero_plan.replan(doc, model, args.cluster)
    for line in lines:
        print(line)
    if args.out:
        (new if isinstance(new, Plan) else Plan(new)).save(args.out, operators_beside=not args.full)
        print(f"plan written to {args.out}")
    return 0
