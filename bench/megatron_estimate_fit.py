"""The four Megatron exports of tests/test_engines_params.py, searched with and without
`--fit-engine-estimate`: step time, sapp's peak and Megatron-LM's own startup estimate of each exported file
(sapp/engines/megatron_estimate.py, main's formula).

    python -m bench.megatron_estimate_fit

Why Megatron's estimate misses the exports (bench/RESULTS.md §16):
core_v0.16.1's estimate fits none of the four, main's only Mixtral, for reasons in the estimator: it
counts 4-byte main_grads (6 + 12/dp bytes a parameter) although `--grad-reduce-in-bf16` keeps them in
bf16; it ignores context parallelism (a rank holds s/cp tokens; the distributed optimizer shards over
dp x cp) and full recomputation (Llama-3-70B recomputes the first 8 layers of each stage);
core_v0.16.1 does not divide the experts by ep (main does). sapp/engines/megatron_estimate.py's port
reproduces both releases' totals exactly.  "completed" is main's formula with those terms added
(`estimate(..., completed=True)`; not Megatron's number): below sapp's peak for GPT-3, Llama-3-8B and
Mixtral; for Llama-3-70B above it and above capacity, because its export is sequence-parallel with full
recomputation and Megatron's estimator (so the port) has an SP formula only for selective
recomputation: the non-SP one divides neither the 10 sbh a layer nor the kept layer inputs by tp.
Activations (with transients), sapp / completed formula: 42.1 / 41.1, 27.6 / 34.3, 47.8 / 35.8, 32.9 /
20.1 GiB (the formula prices a MoE layer as a dense MLP, with nothing for top-2 routing; Megatron-Core's
own MoE layer keeps 58.5 sbh less its norms against a dense SwiGLU one's 33, below); weights, gradients
and optimizer: 23.3 / 22.8, 42.6 / 40.2, 18.7 / 17.8, 17.6 / 17.6 (`python -m bench.megatron_estimate_fit`'s
second table).  sapp's peak is the plan as exported (Megatron's
recomputation flags), priced so.

bench/RESULTS.md §16's run (2026-11-29, CPU box, 71 s): Megatron-LM accepts the four exports at
core_v0.16.1 and main; main's `report_theoretical_memory` prints 63.3 / 67.0 / 50.1 / 44.4 GiB (`python -m
bench.megatron_accepts --tag HEAD --fit-engine-estimate`).  Under `--fit-engine-estimate core_v0.16.1` that
release prints 63.3 / 67.0 / 50.1 / 63.2 GiB (154.7 for Mixtral's free plan) and Mixtral becomes pp 8, dp
16, interleaved v 2, 6.245 s/step against 5.880 s (2026-12-01)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from sapp.engines.estimate_fit import file_estimate_bytes  # noqa: E402
from sapp.engines.megatron import tokens  # noqa: E402
from sapp.engines.megatron_estimate import estimate  # noqa: E402
from test_engines_estimate_fit import _export  # noqa: E402
from test_engines_params import CASES  # noqa: E402

GiB = 2 ** 30


def main():
    print("| export | cluster | plan | step s | sapp peak GiB | Megatron estimate GiB | usable GiB |")
    print("|---|---|---|---|---|---|---|")
    for case in CASES:
        for fit in (False, True):
            text, plan, cl = _export(case, fit)
            pr = plan["predicted"]
            head = next(l for l in text.splitlines() if l.startswith("# priced")).split(": ", 1)[1]
            print(f"| {case}{' (fit estimate)' if fit else ''} | {CASES[case][1]} | {head} | {pr['step_time_s']:.2f} | "
                  f"{pr['peak_memory_bytes'] / GiB:.1f} | {file_estimate_bytes(text, cl.devices) / GiB:.1f} | "
                  f"{cl.usable_memory / GiB:.1f} |")
    print("\nThe plans without the flag: sapp's activations (with transients) and states beside Megatron's formula "
          "completed (estimate(..., completed=True)), GiB")
    print("| export | sapp activations | formula activations | sapp states | formula weights+optimizer |")
    print("|---|---|---|---|---|")
    for case in CASES:
        text, plan, cl = _export(case, False)
        a, m = tokens(text), plan["predicted"]["memory"]
        e = estimate(a, world_size=cl.devices, vocab=int(a["--vocab-size"]), completed=True)
        print(f"| {case} | {(m['activations'] + m.get('transient', 0)) / GiB:.1f} | {e['activation_mb'] / 1024:.1f} | "
              f"{(m['params'] + m['grads'] + m['optimizer']) / GiB:.1f} | {e['weights_mb'] / 1024:.1f} |")


if __name__ == "__main__":
    main()
