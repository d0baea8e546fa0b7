"""The four Megatron exports of tests/test_engines_params.py, searched with and without
`--fit-engine-estimate`: step time, sapp's peak and Megatron-LM's own startup estimate of each exported file
(sapp/engines/megatron_estimate.py, main's formula).

    python -m bench.megatron_estimate_fit
"""
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
