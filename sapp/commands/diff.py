import os

from ..plan import Plan


def add_arguments(p):
    p.add_argument("a", help="first plan JSON file")
    p.add_argument("b", help="second plan JSON file")


def run(args):
    from ..report import diff
    a, b = Plan.load(args.a), Plan.load(args.b)
    na, nb = os.path.basename(args.a), os.path.basename(args.b)
    if na == nb:
        na, nb = args.a, args.b
    print(diff(a, b, names=(na, nb)), end="")
    return 0
