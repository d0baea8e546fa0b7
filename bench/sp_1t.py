"""Issue 15's 1T GPT repro: t=8, p=64 pinned on 512 a100-80g, global batch 512 in 512 micro-batches,
1F1B (l=128, h=25600, a=160, s=2048, V=51200, ffn=4h: Korthikanti 2022 Table 3), priced with the fused
runtime (Megatron's kernels; `--runtime eager` for sapp's own).  Prices full recomputation, selective
recomputation without and with sequence parallelism, and the free search, and prints step time, peak
memory and the blocks per stage.  Korthikanti Table 4's shape: selective + SP is faster than full
recomputation (it only fits with SP).  Issue 29: it was priced about as slow as full (100.9 s vs
101.4 s) because the token table stayed whole on every tp rank under SP, which left stage 0 one
block short and a third block on another stage (sp_layout.vocab_split).

    PYTHONPATH=. python -m bench.sp_1t [--runtime fused|eager]
"""
from __future__ import annotations

import argparse
import time

import sapp
from sapp.errors import InfeasibleError

MODEL = dict(l=128, h=25600, a=160, s=2048, V=51200, ffn=4 * 25600, attn="eager")
CLUSTER = "a100-80g:nodes=64"
PINS = {"tp": 8, "pp": 64, "schedule": "1f1b", "micro_batches": 512}


def price(graph, runtime, **pins):
    t0 = time.perf_counter()
    try:
        plan = sapp.search("gpt-tiny", CLUSTER, global_batch=512, graph=graph, runtime=runtime,
                           constraints=dict(PINS, **pins))
    except InfeasibleError as e:
        return None, str(e)[:140], time.perf_counter() - t0
    return plan, "", time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", default="fused", choices=("fused", "eager"))
    a = ap.parse_args(argv)
    from sapp.api import capture_graph, resolve_model
    module, _, _ = resolve_model(sapp.models.get("gpt-tiny", **MODEL))
    graph, cap = capture_graph(module)
    print(f"1T GPT captured in {cap:.1f} s; {CLUSTER}, global batch 512, pins {PINS}, runtime {a.runtime}")
    print(f"{'case':34s} {'step s':>9s} {'peak GB':>8s} {'sp':>5s} {'recompute':>10s} {'m':>4s} {'search s':>8s}  blocks per stage")
    rows = [("full recompute, no SP", dict(recompute="full", sp=False)),
            ("selective, no SP", dict(recompute="selective", sp=False)),
            ("selective + SP", dict(recompute="selective", sp=True)),
            ("full recompute + SP", dict(recompute="full", sp=True)),
            ("free (sp and recompute searched)", {})]
    steps = {}
    for label, pins in rows:
        plan, err, s = price(graph, a.runtime, **pins)
        if plan is None:
            print(f"{label:34s} {'does not fit':>9s}  {err}")
            continue
        pr = plan["predicted"]
        steps[label] = pr["step_time_s"]
        counts = sorted({len(st["blocks"]) for st in plan["pipeline"]["stages"]})
        print(f"{label:34s} {pr['step_time_s']:9.2f} {pr['peak_memory_bytes'] / 1e9:8.1f} "
              f"{str(plan['parallel'].get('sp', False)):>5s} {plan['recompute']['default']:>10s} "
              f"{plan['pipeline']['micro_batches']:4d} {s:8.1f}  {counts}")
    if "selective + SP" in steps:
        for full in ("full recompute, no SP", "full recompute + SP"):
            if full in steps:
                print(f"selective + SP / {full}: {steps['selective + SP'] / steps[full]:.3f}")


if __name__ == "__main__":
    main()
