from ..plan import Plan


def add_arguments(p):
    p.add_argument("plan", help="plan JSON file (from `sapp search`)")


def run(args):
    from ..report import explain
    from .. import hetero_plan
    doc = hetero_plan.load_if_hetero(args.plan)
    if doc is not None:                     # a plan over a mixed cluster: its groups
        print(hetero_plan.explain(doc), end="")
        return 0
    print(explain(Plan.load(args.plan)), end="")
    return 0
