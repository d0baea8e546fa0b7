"""DeepSeek-V3-like (sapp zoo `deepseek-v3-like`: 61 layers, 670.4B total / 36.9B active parameters,
256 routed experts top-8 + 1 shared) on 2048 H800 (`h800:nodes=256`): capture time, search time
(target: at most 5 s on an idle machine), the plan and its memory.

    python -m bench.moe_scale [--global-batch 4096] [--nodes 256]"""
from __future__ import annotations

import argparse
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--global-batch", type=int, default=4096)
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--model", default="deepseek-v3-like")
    a = ap.parse_args(argv)
    import sapp.models as zoo
    from sapp.api import search
    from sapp.capture import capture
    info = zoo.info(a.model)
    active = zoo.BUILDERS["moe"][1](**info["config"], active=True) if info["kind"] == "moe" else info["params"]
    print(f"{a.model}: {info['params'] / 1e9:.1f}B parameters, {active / 1e9:.1f}B active")
    model = zoo.get(a.model)
    t0 = time.perf_counter()
    g = capture(model, batch=1)
    t1 = time.perf_counter()
    plan = search(model, f"h800:nodes={a.nodes}", global_batch=a.global_batch, graph=g)
    t2 = time.perf_counter()
    par, pipe, pr = plan["parallel"], plan["pipeline"], plan["predicted"]
    st = plan._d.get("search_stats") or {}
    print(f"capture {t1 - t0:.1f} s, search {t2 - t1:.2f} s {st}")
    print(f"plan: dp={par['dp']} tp={par['tp']} pp={par['pp']} ep={par.get('ep', 1)} {pipe['schedule']} "
          f"m={pipe['micro_batches']} mbs={pipe.get('micro_batch_size')} zero={plan['zero']} "
          f"recompute={plan['recompute']['default']}")
    mem = pr.get("memory") or {}
    print(f"step {pr['step_time_s']:.3f} s, MFU {100 * pr['mfu']:.1f}%, peak {pr['peak_memory_bytes'] / 1e9:.1f} GB of "
          f"{pr.get('capacity_bytes', 0) / 1e9:.1f} GB usable: " + ", ".join(f"{k} {v / 1e9:.1f} GB" for k, v in sorted(mem.items())))
    print(f"comm by kind: " + ", ".join(f"{k} {v:.3f} s" for k, v in sorted((pr.get('comm_by_kind') or {}).items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
