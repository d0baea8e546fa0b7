def add_arguments(p):
    p.add_argument("plan", help="plan JSON file (from `sapp search`; a mixed cluster's plan shows each group)")


def run(args):
    from ..plan import load_any
    from ..report import explain
    from ..report.mixed import explain_mixed
    kind, doc = load_any(args.plan)
    print(explain_mixed(doc) if kind == "mixed" else explain(doc), end="")
    return 0
