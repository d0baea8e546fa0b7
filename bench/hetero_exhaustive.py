"""Mixed-cluster search quality: `python -m bench.hetero_exhaustive`.

On small cases (a zoo model on two or three device groups of different kinds), the free search over
batch shares (sapp/search/hetero.py: proportional start, quanta moved from the slowest group, every
group alone) against the exhaustive reference: every composition of the global batch into the
groups' shares (unused groups included), each group priced by the same joint search.
gap = free / exhaustive - 1; the target is 0 (at most +0.1%)."""
from __future__ import annotations

import sys
import time

# (model, groups spec, global batch, share quantum)
CASES = [("gpt3-125m", "a100-80g:nodes=1+h100-80g:nodes=1", 64, 2),
         ("gpt3-125m", "a100-80g:nodes=1+h100-80g:nodes=1,gpus=4", 48, 2),
         ("gpt3-350m", "v100-32g:nodes=1+a100-80g:nodes=1+h100-80g:nodes=1", 48, 4)]
LIMIT = 1e-3


def run_case(model, spec, gb, q):
    from sapp.api import capture_spec, tp_search_fn
    from sapp.cluster.groups import parse
    from sapp.costmodel import CostSettings
    from sapp.search import hetero
    graph = capture_spec(model)[3]
    mc = parse(spec)
    settings = CostSettings(precision=mc.slowest().precision)
    t0 = time.perf_counter()
    free = hetero.search(graph, mc, global_batch=gb, settings=settings, search_fn=tp_search_fn(), q=q, baselines=False)
    t1 = time.perf_counter()
    full = hetero.search(graph, mc, global_batch=gb, settings=settings, search_fn=tp_search_fn(), q=q,
                         exhaustive=True, baselines=False)
    t2 = time.perf_counter()
    return {"model": model, "cluster": spec, "global_batch": gb, "free_shares": free[0], "free_s": free[1],
            "exhaustive_shares": full[0], "exhaustive_s": full[1], "gap": free[1] / full[1] - 1,
            "free_search_s": t1 - t0, "exhaustive_search_s": t2 - t1}


def main(argv=None):
    worst = 0.0
    for case in CASES:
        r = run_case(*case)
        worst = max(worst, r["gap"])
        print(f"{r['model']:10} {r['cluster']:52} B={r['global_batch']:4d} free {r['free_shares']} {r['free_s']:.5g} s"
              f"  exhaustive {r['exhaustive_shares']} {r['exhaustive_s']:.5g} s  gap {r['gap']:+.3%}"
              f"  ({r['free_search_s']:.2g} s vs {r['exhaustive_search_s']:.2g} s)", flush=True)
    print(f"worst gap {worst:+.3%} (limit +{LIMIT:.1%})")
    return 0 if worst <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
