from ..plan import Plan


def add_arguments(p):
    p.add_argument("plan", help="plan JSON file (from `sapp search`)")


def run(args):
    from ..report import explain
    print(explain(Plan.load(args.plan)), end="")
    return 0
