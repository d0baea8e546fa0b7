"""Llama-3-405B-like model (126 layers, h=16384, 128 heads, 8 KV heads, ffn 53248, V=128256; an HF
LlamaConfig on meta, bench/llama3_405b.json) on 16,384 h100-80g with 16M tokens per step: global
batch 2048 at seq 8192 and 128 at seq 131072.  Prints capture and search wall times, the plan (with
context parallelism at 131072) and whether it fits, beside Llama 3's published layouts (Table 4 of
"The Llama 3 Herd of Models": tp8 cp1 pp16 dp128 at 8192; tp8 cp16 pp16 dp8 at 131072), priced pinned.

    python -m bench.long_context                 # both sequence lengths
    python -m bench.long_context --profile       # pyinstrument profile of the 131072 search
"""
from __future__ import annotations

import argparse
import os
import time

CONFIG = os.path.join(os.path.dirname(__file__), "llama3_405b.json")
CLUSTER = "h100-80g:nodes=2048"              # 2048 x 8 = 16,384 GPUs
RUNS = ((8192, 2048), (131072, 128))         # (sequence, global batch): 16M tokens per step
PUBLISHED = {8192: {"tp": 8, "cp": 1, "pp": 16}, 131072: {"tp": 8, "cp": 16, "pp": 16}}   # dp: the rest


def capture(seq):
    """The 405B graph at `seq` (meta tensors; capture traces a few blocks and copies them)."""
    from sapp.api import capture_graph
    from sapp.models import build
    t0 = time.perf_counter()
    model = build(CONFIG, device="meta", seq=seq)
    graph, _ = capture_graph(model)
    return model, graph, time.perf_counter() - t0


def run(seq, batch, profile=False):
    import sapp
    from sapp.units import fmt_bytes
    model, graph, cap_s = capture(seq)
    prof = None
    if profile:
        from pyinstrument import Profiler
        prof = Profiler()
        prof.start()
    t0, c0 = time.perf_counter(), time.process_time()
    plan, res = sapp.search(model, CLUSTER, global_batch=batch, graph=graph, return_result=True)
    search_s = time.perf_counter() - t0
    # CPU seconds too: on a shared machine the wall time counts other processes' turns
    cpu_s = time.process_time() - c0
    if prof is not None:
        prof.stop()
        print(prof.output_text(unicode=False, color=False, show_all=False))
    par, pr, pipe = plan["parallel"], plan["predicted"], plan["pipeline"]
    fits = pr["peak_memory_bytes"] <= pr["capacity_bytes"]
    print(f"seq {seq:>6}  batch {batch:>4}  tokens/step {seq * batch / 2**20:.0f}M  capture {cap_s:5.1f} s  "
          f"search {search_s:5.2f} s wall, {cpu_s:5.2f} s CPU (joint search {res.stats['search_s']:.2f} s wall; "
          f"{res.stats['configs']} configs, {res.stats['evaluated']} evaluated, {res.stats['profiles']} profiles)")
    print(f"  plan  tp={par['tp']} cp={par.get('cp', 1)} pp={par['pp']} dp={par['dp']} "
          f"m={pipe['micro_batches']}x{pipe['micro_batch_size']} {pipe['schedule']} zero={plan['zero']} "
          f"recompute={plan['recompute']['default']}  step {pr['step_time_s']:.2f} s  MFU {pr['mfu']:.1%}  "
          f"peak {fmt_bytes(pr['peak_memory_bytes'])} of {fmt_bytes(pr['capacity_bytes'])}  "
          f"{'fits' if fits else 'DOES NOT FIT'}")
    pub = published(model, graph, seq, batch)
    return {"published": pub, "seq": seq, "search_s": search_s, "cpu_s": cpu_s, "capture_s": cap_s, "cp": par.get("cp", 1), "fits": fits,
            "plan": plan}


def published(model, graph, seq, batch):
    """Llama 3's own layout at `seq` pinned (tp, cp, pp; dp the rest): the search fills in the rest."""
    import sapp
    from sapp.errors import SappError
    from sapp.units import fmt_bytes
    pin = PUBLISHED[seq]
    label = " ".join(f"{k}={v}" for k, v in pin.items())
    try:
        plan = sapp.search(model, CLUSTER, global_batch=batch, graph=graph, constraints=dict(pin))
    except SappError as e:
        print(f"  published (Llama 3, Table 4) {label}: {e}")
        return None
    par, pr, pipe = plan["parallel"], plan["predicted"], plan["pipeline"]
    print(f"  published (Llama 3, Table 4) {label} dp={par['dp']}: m={pipe['micro_batches']} {pipe['schedule']} "
          f"zero={plan['zero']} recompute={plan['recompute']['default']}  step {pr['step_time_s']:.2f} s  "
          f"peak {fmt_bytes(pr['peak_memory_bytes'])}  fits")
    return plan


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, choices=[s for s, _ in RUNS], help="one sequence length only")
    ap.add_argument("--profile", action="store_true", help="pyinstrument profile of the search")
    a = ap.parse_args(argv)
    out = []
    for seq, batch in RUNS:
        if a.seq is None or a.seq == seq:
            out.append(run(seq, batch, profile=a.profile))
    return out


if __name__ == "__main__":
    main()
