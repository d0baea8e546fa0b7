def add_arguments(p):
    p.add_argument("plan", help="plan JSON file (from `sapp search`; a mixed cluster's plan draws each group)")
    p.add_argument("--out", default="plan.png", help="image file to write (default plan.png)")
    p.add_argument("--width", type=int, default=1400, help="pixels (default 1400)")
    p.add_argument("--height", type=int, default=900, help="pixels (default 900)")


def run(args):
    from ..plan import load_any
    from ..report import plot
    from ..report.plot import check_size, image_suffixes
    from ..report.plot_mixed import plot_mixed
    from ._paths import check_out
    check_size(args.width, args.height)
    check_out(args.out, suffixes=image_suffixes())
    kind, doc = load_any(args.plan)
    (plot_mixed if kind == "mixed" else plot)(doc, args.out, width=args.width, height=args.height)
    print(f"wrote {args.out}")
    return 0
