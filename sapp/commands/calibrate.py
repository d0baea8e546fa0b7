import json


def add_arguments(p):
    p.add_argument("--out", required=True, help="cluster JSON file to write (use it as `--cluster FILE.json`)")
    p.add_argument("--procs", type=int, default=2, help="processes (devices) to measure with, default 2")
    p.add_argument("--quick", action="store_true", help="fewer sizes and shorter timing (~10 s)")
    p.add_argument("--timeout", type=float, default=180.0, help="give up after this many seconds (default 180)")
    p.add_argument("--name", default="calibrated", help="cluster name stored in the file")
    p.add_argument("--raw", help="also write the raw measurements to this JSON file")


def run(args):
    import math
    import os
    from ..calibrate import calibrate
    from ..errors import UsageError
    from ..units import fmt_bytes
    from ._paths import check_out
    # everything checked before measuring: a calibration takes seconds to minutes
    check_out(args.out, suffixes=("json",))
    if args.raw:
        check_out(args.raw, "--raw")
    limit = 4 * (os.cpu_count() or 1)
    if not 1 <= args.procs <= limit:
        raise UsageError(f"--procs must be between 1 and {limit} on this machine, got {args.procs}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    cluster, raw = calibrate(procs=args.procs, quick=args.quick, timeout_s=args.timeout, name=args.name)
    cluster.save(args.out)
    if args.raw:
        try:
            with open(args.raw, "w") as f:
                json.dump(raw, f, indent=1, sort_keys=True, default=str)
        except OSError as e:
            raise UsageError(f"cannot write --raw {args.raw}: {e.strerror or e}") from None
    c = cluster
    print(f"peak {c.peak_flops / 1e9:.1f} GFLOP/s per process (typical GEMM {c.compute_efficiency:.0%}), memory {fmt_bytes(c.mem_bandwidth)}/s "
          f"(element-wise {c.memory_efficiency:.0%}), host<->device {fmt_bytes(c.h2d_bw)}/s")
    if c.gpus_per_node > 1:
        print(f"all_reduce: alpha {c.intra_latency * 1e6:.1f} us, beta {fmt_bytes(c.intra_bw)}/s over {c.gpus_per_node} processes")
    print(f"wrote {args.out}")
    return 0
