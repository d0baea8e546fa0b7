from ..cluster import PRESETS
from ..units import fmt_bytes, fmt_flops


def add_arguments(p):
    p.add_argument("--json", action="store_true", help="print the presets as JSON")
    p.add_argument("spec", nargs="?", help="describe this cluster spec or file instead (A+B: a mixed cluster's groups)")


def run(args):
    if getattr(args, "spec", None):
        from sapp.cluster.groups import describe_any
        print(describe_any(args.spec, as_json=args.json))
        return 0
    if args.json:
        import json
        print(json.dumps({k: v.to_dict() for k, v in PRESETS.items()}, indent=2, sort_keys=True))
        return 0
    print(f"{'preset':10} {'peak':>13} {'memory':>10} {'mem BW':>10} {'intra':>10} {'inter/dev':>10} {'per node':>8}")
    for name, c in PRESETS.items():
        print(f"{name:10} {fmt_flops(c.peak_flops):>13} {fmt_bytes(c.device_memory):>10} {fmt_bytes(c.mem_bandwidth) + '/s':>10} "
              f"{fmt_bytes(c.intra_bw) + '/s':>10} {fmt_bytes(c.inter_bw) + '/s':>10} {c.gpus_per_node:8d}")
    print("\nspec: NAME:nodes=N[,gpus=G][,key=value...]  e.g. a100-80g:nodes=128  or a JSON file from `sapp calibrate`")
    return 0
