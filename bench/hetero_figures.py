"""Mixed-cluster figures: `python -m bench.hetero_figures [--only NAME]`.

For zoo models on 8 A100 nodes + 4 H100 nodes: the mixed plan's predicted step against the best on
each group alone and on all devices priced as A100s, with the search's time; then the search time on
a 1024-device two-group cluster against the homogeneous search of the same size."""
from __future__ import annotations

import argparse
import sys
import time

MIXED = "a100-80g:nodes=8+h100-80g:nodes=4"
MODELS = ("gpt3-13b", "llama3-70b", "mixtral-8x7b")
SCALE = ("gpt3-13b", "a100-80g:nodes=64+h100-80g:nodes=64", "a100-80g:nodes=128")


def mixed_case(model, spec=MIXED):
    from sapp import hetero_plan
    from sapp.cluster_groups import parse
    doc, timing = hetero_plan.search(model, parse(spec))      # the zoo's batch (GPT-3: the paper's)
    return doc, timing


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    args = ap.parse_args(argv)
    for model in MODELS:
        if args.only and args.only not in model:
            continue
        doc, timing = mixed_case(model)
        step = doc["predicted"]["step_time_s"]
        alone = doc["baselines"]["alone"]
        uni = doc["baselines"]["uniform_slowest"]
        best_alone = min(v for v in alone.values() if v is not None) if any(v is not None for v in alone.values()) else None
        shares = ", ".join(f"{g['name']} {g['batch_share']}" + (f" dp{g['parallel']['dp']} tp{g['parallel']['tp']} "
                                                               f"pp{g['parallel']['pp']}" if g["batch_share"] else "")
                           for g in doc["groups"])
        fmt = lambda v: "n/a" if v is None else f"{v:.4g} s ({v / step - 1:+.1%})"
        print(f"{model:13} B={doc['model']['global_batch']}: mixed {step:.4g} s [{shares}; sync "
              f"{doc['predicted']['cross_group_sync_s']:.3g} s]  alone: "
              + ", ".join(f"{k} {fmt(v)}" for k, v in alone.items())
              + f"  best alone {fmt(best_alone)}  uniform-as-A100 {fmt(uni)}"
              + f"  search {timing['search_s']:.1f} s (split {timing['split_search_s']:.1f} s, {timing['evaluations']} group searches)", flush=True)
    if not args.only or args.only == "scale":
        from sapp import search
        model, mixed, homo = SCALE
        doc, timing = mixed_case(model, mixed)
        t0 = time.perf_counter()
        plan = search(model, homo, cache=True)
        homo_s = time.perf_counter() - t0
        print(f"scale {model} 1024 devices: mixed {mixed} search {timing['search_s']:.1f} s "
              f"(split {timing['split_search_s']:.1f} s, {timing['evaluations']} group searches, baselines and plans the rest), homogeneous {homo} search {homo_s:.1f} s "
              f"(plan step {plan['predicted']['step_time_s']:.4g} s, mixed {doc['predicted']['step_time_s']:.4g} s)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
