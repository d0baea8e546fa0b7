"""Host/device placement figures: `python -m bench.placement [--measure]`.

1. Wide&Deep (Criteo-like, 26 fields, dim 80, batch 16000) on one a100-80g: 100M vs 1M rows.
2. GPT-10B and GPT-3 1.3B on one v100-32g (micro-batch 1 x 8, s = 2048).
3. GPT-10B on 8 x v100-32g (dp 8, micro-batch 1 x 8): ZeRO-3 on the device vs ZeRO-Offload.
4. Host memory exhausted: the errors with the numbers.
--measure: time the emitted host pieces on this CPU (lookup, sparse optimizers, offload) and put the
cost model's prediction for the `cpu` cluster preset beside them.
Decisions come from bench.placement_standalone.decide (placement x per-block recomputation for one
data-parallel configuration; the joint search makes the same choice inside its loop)."""
from __future__ import annotations

import argparse
import time

from sapp.cluster import Cluster
from sapp.costmodel import CostSettings
from sapp.errors import InfeasibleError
from bench.placement_standalone import decide
from sapp.units import fmt_bytes, fmt_time

S = CostSettings()


def _graph(name, batch, **cfg):
    import sapp.models as M
    from sapp.capture import capture
    return capture(M.get(name, **cfg), batch=batch)


def _show(title, d):
    p = d.option.section["predicted"]
    print(f"  {title}: {d.name}  step {fmt_time(d.step_time_s)} (compute {fmt_time(d.compute_s)}, "
          f"ZeRO comm {fmt_time(d.comm_s)}, host exposed {fmt_time(p['exposed_s'])}), "
          f"device {fmt_bytes(d.device_bytes)} of {fmt_bytes(d.device_capacity)}")
    print(f"    why: {p['reason']}")
    for k, c in sorted(p.get("components", {}).items()):
        parts = ", ".join(f"{x[:-2]} {fmt_time(v)}" for x, v in sorted(c.items()) if x.endswith("_s"))
        print(f"    {k}: {parts}; host {fmt_bytes(c['host_bytes_per_device'])}/device")
    for r in d.table:
        rc = ", ".join(f"{k} {v}" for k, v in r["recompute"].items() if v) or "-"
        print(f"      {r['option']:<26} fits={str(r['fits']):<5} step {fmt_time(r['step_time_s']):>10}  "
              f"host +{fmt_time(r['extra_time_s']):>10}  recompute[{rc}] +{fmt_time(r['recompute_s'])}  "
              f"device {fmt_bytes(r['device_bytes'])}  host/node {fmt_bytes(r['host_bytes_per_node'])}")


def figures():
    a100, v100, v100x8 = (Cluster.parse("a100-80g:devices=1"), Cluster.parse("v100-32g:devices=1"),
                          Cluster.parse("v100-32g:devices=8"))
    print("1. Wide&Deep on one a100-80g, batch 16000")
    for name in ("wide-deep-100m", "wide-deep-1m"):
        _show(name, decide(_graph(name, 16000), a100, S))
    print("2. GPT on one v100-32g, micro-batch 1 x 8, s=2048")
    g10 = _graph("gpt-10b", 1)
    print(f"  gpt-10b: {g10.param_count() / 1e9:.2f}B params, model states alone {fmt_bytes(16 * g10.param_count())}")
    _show("gpt-10b", decide(g10, v100, S, micro_batches=8))
    _show("gpt3-1.3b", decide(_graph("gpt3-1.3b", 1), v100, S, micro_batches=8))
    print("3. GPT-10B on 8 x v100-32g, dp 8, micro-batch 1 x 8 (global batch 64)")
    res = {}
    for zero in (3, 2, 1):
        try:
            d = decide(g10, v100x8, S, dp=8, zero=zero, micro_batches=8)
        except InfeasibleError as e:     # ZeRO-1 keeps whole gradients on the device, offload or not
            print(f"  ZeRO-{zero}: {e}")
            continue
        res[zero] = d
        _show(f"ZeRO-{zero}", d)
    best = min(res.values(), key=lambda d: d.step_time_s)
    off = min((d for d in res.values() if d.name != "device"), key=lambda d: d.step_time_s, default=None)
    dev = min((d for d in res.values() if d.name == "device"), key=lambda d: d.step_time_s, default=None)
    if off and dev:
        print(f"  => {'ZeRO-3 on the device' if best is dev else 'ZeRO-Offload'} wins: {fmt_time(dev.step_time_s)} "
              f"(ZeRO-3) vs {fmt_time(off.step_time_s)} (offload): the 8 devices share one host's memory "
              f"bandwidth for CPU Adam, while ZeRO-3's gathers run on NVLink")
    print("4. Host memory exhausted")
    for title, fn in (("gpt-10b, 8 x v100-32g, dp 8 without ZeRO (every rank offloads a full optimizer copy)",
                       lambda: decide(g10, v100x8, S, dp=8, zero=0, micro_batches=8)),
                      ("Wide&Deep with 10B rows on one a100-80g",
                       lambda: decide(_graph("wide-deep", 16000, vocab=10_000_000_000), a100, S))):
        try:
            fn()
            print(f"  {title}: unexpectedly fits")
        except InfeasibleError as e:
            print(f"  {title}:\n    InfeasibleError: {e}")


def measure(steps=5):
    """Time the emitted pieces on this CPU (both 'devices' are the CPU here, so copies are memcpy)."""
    import torch

    import sapp.models as M
    from sapp.emit.host import host
    from sapp.placement import placement_options
    torch.manual_seed(0)
    rows, batch = 20_000, 2048
    m = M.get("wide-deep", device="cpu", rows_per_field=rows, deep=(256, 128))
    g = _graph("wide-deep", batch, rows_per_field=rows, deep=(256, 128))
    opt = {o.name: o for o in placement_options(g, list(g.nodes), Cluster.parse("cpu:gpus=1"), S)}["embedding-host"]
    section = opt.section
    batches = [(M.example_inputs(m, batch), M.example_targets(m, batch)) for _ in range(2)]
    t = time.perf_counter()
    logs = host.train_steps(m, section, batches, steps, "cpu", log=None)
    wall = (time.perf_counter() - t) / steps
    meas = {}
    for r in logs[1:]:
        for k, v in r["host"].items():
            meas[k] = meas.get(k, 0.0) + v / (len(logs) - 1)
    pred = section["predicted"]["components"]["embedding"]
    print(f"measured on this CPU, wide-deep {26 * rows} rows x 80, batch {batch}: step {fmt_time(wall)}")
    for k in ("lookup_s", "h2d_s", "d2h_s", "optimizer_s"):
        print(f"  {k[:-2]:<10} measured {fmt_time(meas.get(k, 0.0)):>10}   predicted (cpu preset) {fmt_time(pred[k]):>10}")
    gm = M.get("gpt-small", device="cpu", dropout=0.0)
    off = {"groups": {"*": {"weights": "device", "grads": "host", "master_weights": "host", "optimizer": "host",
                            "optimizer_kind": "adam"}}, "predicted": {}}
    gb = [(M.example_inputs(gm, 8), M.example_targets(gm, 8))]
    logs = host.train_steps(gm, off, gb, steps, "cpu", log=None)
    n = sum(p.numel() for p in gm.parameters())
    o = sum(r["host"].get("optimizer_s", 0.0) for r in logs[1:]) / (len(logs) - 1)
    print(f"  offload: CPU Adam over {n / 1e6:.1f}M params {fmt_time(o)} = {n * 28 / o / 1e9:.1f} GB/s of "
          f"Adam traffic (28 B/param)")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.placement")
    ap.add_argument("--measure", action="store_true", help="also time the emitted host pieces on this CPU")
    a = ap.parse_args(argv)
    t = time.perf_counter()
    figures()
    if a.measure:
        measure()
    print(f"({time.perf_counter() - t:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
