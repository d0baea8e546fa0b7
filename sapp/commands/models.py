"""`sapp models`: list the built-in model zoo."""
from __future__ import annotations


def add_arguments(p):
    p.add_argument("--json", action="store_true", help="print name, kind, config and parameters as JSON")


def run(args):
    import importlib
    models = importlib.import_module("sapp.models")
    rows = [models.info(n) for n in models.names()]
    if args.json:
        import json
        print(json.dumps(rows, indent=1, sort_keys=True, default=list))
        return 0
    print(f"{'model':16} {'kind':9} {'params':>10}  config")
    for r in rows:
        cfg = ", ".join(f"{k}={v}" for k, v in sorted(r["config"].items()) if k not in ("dropout",))
        print(f"{r['name']:16} {r['kind']:9} {r['params'] / 1e6:>9.1f}M  {cfg}")
    print("\nuse: sapp search --model NAME --cluster a100-80g:nodes=N")
    return 0
