import os


def add_arguments(p):
    p.add_argument("a", help="first plan JSON file (a mixed cluster's plan compares each group)")
    p.add_argument("b", help="second plan JSON file")


def run(args):
    from ..plan import load_any
    from ..report.mixed import diff_any
    a, b = load_any(args.a), load_any(args.b)
    na, nb = os.path.basename(args.a), os.path.basename(args.b)
    if na == nb:
        na, nb = args.a, args.b
    print(diff_any(a, b, names=(na, nb)), end="")
    return 0
