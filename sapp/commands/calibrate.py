"""`sapp calibrate --out me.json`: measure this machine (sapp/calibrate/cluster_fit.py), or
`sapp calibrate --from-run RUN... --cluster BASE --out me.json`: fit BASE's efficiency figures to
measured steps of your own jobs (sapp/calibrate/from_runs.py)."""
import json
import os


def add_arguments(p):
    p.add_argument("--out", required=True, help="cluster JSON file to write (use it as `--cluster FILE.json`)")
    p.add_argument("--procs", type=int, default=2, help="processes (devices) to measure with, default 2")
    p.add_argument("--quick", action="store_true",
                   help="fewer sizes and shorter timing (under a minute: 48 s measured on 2 shared CPU cores)")
    p.add_argument("--timeout", type=float, default=180.0, help="give up after this many seconds (default 180)")
    p.add_argument("--name", default=None, help="cluster name stored in the file (default: calibrated, or "
                   "BASE-calibrated with --from-run)")
    p.add_argument("--raw", help="also write the raw measurements to this JSON file")
    r = p.add_argument_group("from measured runs (instead of micro-benchmarks)")
    r.add_argument("--from-run", dest="from_run", nargs="+", metavar="RUN",
                   help="measured runs: `sapp run --log-json` logs, `sapp run --out` files, or JSON objects "
                        '{"plan": "plan.json", "step_time_s": 1.23, "peak_memory_gib": 61.5}; e.g. '
                        "sapp calibrate --from-run run.jsonl --cluster h100-80g --out mine.json")
    r.add_argument("--cluster", help="with --from-run: the cluster the runs trained on (a preset or JSON file), whose "
                                     "efficiency figures are fitted")
    r.add_argument("--fit", default="auto",
                   help="with --from-run: what to fit, auto (default: compute; communication where the runs' "
                        "communication shares differ; memory where a run states its allocator peak) or a list of "
                        "compute,comm,memory")


def run(args):
    import math
    from ..errors import UsageError
    from ._paths import check_out
    # everything checked before measuring: a calibration takes seconds to minutes
    check_out(args.out, suffixes=("json",))
    if args.from_run:
        return _from_runs(args)
    if args.cluster or args.fit != "auto":
        raise UsageError("--cluster and --fit go with --from-run (a fit to measured runs); drop them to measure "
                         "this machine")
    from ..calibrate import calibrate
    from ..units import fmt_bytes
    if args.raw:
        check_out(args.raw, "--raw")
    limit = 4 * (os.cpu_count() or 1)
    if not 1 <= args.procs <= limit:
        raise UsageError(f"--procs must be between 1 and {limit} on this machine, got {args.procs}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    from ..report.progress import LOG_EVERY, Progress
    with Progress(label="calibrate", counts=False, log_every=LOG_EVERY) as prog:    # a bar, or log lines
        prog.status(f"measuring kernels, memory and collectives in {args.procs} process(es)"
                    f"{' (quick)' if args.quick else ''}")
        prog.ticking()
        cluster, raw = calibrate(procs=args.procs, quick=args.quick, timeout_s=args.timeout,
                                 name=args.name or "calibrated")
    cluster.save(args.out)
    if args.raw:
        try:
            from ..fileio import write_atomic
            write_atomic(args.raw, json.dumps(raw, indent=1, sort_keys=True, default=str))
        except OSError as e:
            raise UsageError(f"cannot write --raw {args.raw}: {e.strerror or e}") from None
    c = cluster
    print(f"peak {c.peak_flops / 1e9:.1f} GFLOP/s per process (typical GEMM {c.compute_efficiency:.0%}), memory {fmt_bytes(c.mem_bandwidth)}/s "
          f"(element-wise {c.memory_efficiency:.0%}), host<->device {fmt_bytes(c.h2d_bw)}/s")
    if c.gpus_per_node > 1:
        print(f"all_reduce: alpha {c.intra_latency * 1e6:.1f} us, beta {fmt_bytes(c.intra_bw)}/s over {c.gpus_per_node} processes")
    print(f"wrote {args.out}")
    return 0


def _from_runs(args):
    """Read every run, build each plan's model (zoo name or HF config only: a plan is data), fit, write."""
    from .. import api
    from ..calibrate import from_runs
    from ..errors import UsageError
    from ..plan import Plan
    if not args.cluster:
        raise UsageError("--from-run needs --cluster, the cluster the runs trained on (e.g. --cluster h100-80g)")
    if len(args.from_run) > 64:
        raise UsageError(f"--from-run takes at most 64 runs, got {len(args.from_run)}")
    want = "auto" if args.fit == "auto" else [w.strip() for w in args.fit.split(",") if w.strip()]
    base = api.resolve_cluster(args.cluster)
    runs = [from_runs.read_run(path) for path in args.from_run]       # every file read before any pricing
    graphs = {}
    for r in runs:
        r.plan = Plan.load(r.plan_path)
        graphs[r.plan_path] = _graph(r.plan, r.source)
    print(f"sapp calibrate: fitting {base.name} to {len(runs)} measured run(s)", flush=True)

    def price(cluster, run):
        spec, settings = graphs[run.plan_path][1:]
        return api.evaluate(spec, cluster, run.plan, graph=graphs[run.plan_path][0], model_args=settings)
    res = from_runs.fit(runs, base, price, want=want, name=args.name)
    res.cluster.save(args.out)
    for u, v in res.fitted.items():
        print(f"fitted    {from_runs._label(u)} {v:.4g}")
    for u, why in res.held.items():
        print(f"held      {from_runs._label(u)} at the base's figure: {why}")
    print(f"{'run':<40} {'measured':>10} {'before':>10} {'after':>10} {'residual':>9}")
    for src, m, b, a in res.rows:
        print(table_row(src, m, b, a))
    print(f"trust band ±{res.band:.1%} (the largest residual, and no tighter than the measured steps' spread)"
          + (f"; {from_runs.EXACT}" if res.exact else ""))
    print(f"wrote {args.out}")
    return 0


def table_row(src, measured, before, after) -> str:
    """One run's row of the fit: the step times in units by magnitude (1.23 s, 285.0 ms), the residual."""
    from ..units import fmt_time
    return (f"{os.path.basename(src)[:40]:<40} {fmt_time(measured):>10} {fmt_time(before):>10} {fmt_time(after):>10} "
            f"{after / measured - 1:>+9.1%}")


def _graph(plan, source):
    """(captured graph, spec, settings) of the model a plan names: a zoo name or HF config, never code."""
    from .. import api
    from ..errors import UsageError
    from ..models.resolve import kind_of
    spec = plan["model"].get("name")
    if not isinstance(spec, str) or kind_of(spec) == "factory":
        raise UsageError(f"--from-run {source}: its plan names the model {str(spec)[:80]!r}, which is code or no "
                         "model; calibrate from plans of zoo models or HF config files")
    settings = dict(plan["model"].get("args") or {}) or None
    graph = api.capture_spec(spec, settings)[3]
    return graph, spec, settings
