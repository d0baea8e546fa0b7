from ..plan import Plan


def add_arguments(p):
    p.add_argument("plan", help="plan JSON file (from `sapp search`)")
    p.add_argument("--out", default="plan.png", help="image file to write (default plan.png)")
    p.add_argument("--width", type=int, default=1400, help="pixels (default 1400)")
    p.add_argument("--height", type=int, default=900, help="pixels (default 900)")


def run(args):
    from ..report import plot
    from ..report.plot import check_size, image_suffixes
    from ._paths import check_out
    check_size(args.width, args.height)
    check_out(args.out, suffixes=image_suffixes())
    plot(Plan.load(args.plan), args.out, width=args.width, height=args.height)
    print(f"wrote {args.out}")
    return 0
