"""`sapp schema [plan|cluster]`: print the published JSON Schema of a plan or a cluster file."""
from __future__ import annotations


def add_arguments(p):
    p.add_argument("which", nargs="?", default="plan", choices=("plan", "cluster"),
                   help="which schema to print (default: plan, of one device kind or a mixed cluster's groups)")


def run(args):
    from .. import schema
    print(schema.text(args.which), end="")
    return 0
