"""Optimizer offload on one real GPU: is it priced as it runs?

    python -m bench.gpu_offload [--steps 6] [--out bench/results] [--models gpt3-350m:4,gpt3-1.3b:4]

Needs a CUDA device (refuses in one line without one).  Three parts, all on this machine:
  1. host rates: pinned device<->host copy bandwidth and torch's fused CPU Adam (fp32 masters, the kernel
     OffloadAdam runs) in parameters per second; they replace the preset's host figures
     (`h2d_bw`, `host_mem_bandwidth`), so the price below is about this host, not a data sheet's;
  2. timeline: OffloadAdam(overlap) on the GPU model, one step, wall-clock stamps of each parameter
     group's CPU Adam against the end of backward: how much host work ran while backward did
     (the price assumes the pipelined order of sapp/placement/cost.py);
  3. for each model: plans pinned to optimizer-on-host and optimizer-on-device (dp = tp = pp = 1),
     searched on that cluster, run with `sapp run --nproc 1`: measured vs predicted step time, and
     whether the faster of the two is the one the price picks.
Writes gpu_offload.{md,json} in --out.

Reading the figures (bench/RESULTS.md §9):
- Under-priced by 26-31%: the worker's Adam runs about 1.45x slower beside a GPU-driving process
  than alone (0.44 s against 0.31 s for 1.42 G params), and the hooks and the worker cost about 0.3-1 ms
  per parameter tensor; the cost model has no term for either.  Device memory of the offload plans is
  7-11% under.
- The asynchronous overlap path equals offload-after-backward bit for bit on the GPU
  (`tests/test_offload_overlap.py::test_cuda_async_overlap_equals_offload_after_backward`, skipped on CPU)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from .sapp_run import run_saved_plan


def host_rates(torch, n_adam=50_000_000, copy_bytes=1 << 28):
    """(pinned h2d bytes/s, pinned d2h bytes/s, fused CPU Adam params/s) measured here."""
    dev = torch.empty(copy_bytes // 4, device="cuda")
    host = torch.empty(copy_bytes // 4, pin_memory=True)

    def best(fn, n=5):
        out = []
        for _ in range(n):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            out.append(time.perf_counter() - t)
        return min(out)
    h2d = copy_bytes / best(lambda: dev.copy_(host, non_blocking=True))
    d2h = copy_bytes / best(lambda: host.copy_(dev, non_blocking=True))
    p = torch.zeros(n_adam, requires_grad=True)
    p.grad = torch.randn(n_adam)
    opt = torch.optim.Adam([p], lr=1e-3, fused=True)
    opt.step()                                   # states allocated outside the timing
    adam = n_adam / statistics.median(best(opt.step, 1) for _ in range(5))
    return h2d, d2h, adam


def cluster_spec(h2d, adam_params_s, preset="h200"):
    """The preset with this host's measured rates.  sapp/placement/cost.py prices CPU Adam as
    params x (ADAM_BYTES_FP32 + weight bytes) / (host_mem_bandwidth x memory_efficiency), bf16-mixed."""
    from sapp import Cluster
    from sapp.placement.cost import ADAM_BYTES_FP32
    base = Cluster.parse(f"{preset}:gpus=1")
    bw = adam_params_s * (ADAM_BYTES_FP32 + 2) / base.memory_efficiency
    return f"{preset}:gpus=1,h2d_bw={h2d:.4g},host_mem_bandwidth={bw:.4g},host_flops=1e15"


def timeline(torch, model_name, batch, steps=3):
    """Stamps of OffloadAdam(overlap)'s group updates against the end of backward, last step."""
    import sapp.models as models
    from sapp.emit.host import host
    model = models.get(model_name, device="cuda", dropout=0.0)      # fp32 weights, bf16 autocast: as emitted
    section = {"groups": {"*": {"weights": "device", "grads": "host", "master_weights": "host",
                                "optimizer": "host", "optimizer_kind": "adam"}}}
    blocks = sorted({".".join(n.split(".")[:2]) for n, _ in model.named_parameters() if n.startswith("layers.")})
    (opt,) = host.build_optimizers(model, section, 1e-4, overlap={"accumulations": 1, "blocks": blocks})
    stamps = []
    inner = opt._update

    def timed(idx):
        t = time.perf_counter()
        inner(idx)
        stamps.append((t, time.perf_counter(), len(idx)))
    opt._update = timed
    lf = models.loss_fn(model)
    ids = models.example_inputs(model, batch, device="cuda")[0]
    y = models.example_targets(model, batch, device="cuda")
    rows = []
    for _ in range(steps):
        stamps.clear()
        opt.stats.take()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lf(model(ids), y)
        torch.cuda.synchronize()
        t_fwd = time.perf_counter()
        loss.backward()
        torch.cuda.synchronize()
        t_bwd = time.perf_counter()
        opt.step()
        torch.cuda.synchronize()
        t_end = time.perf_counter()
        n = sum(k for *_, k in stamps)
        before = sum(max(0.0, min(e, t_bwd) - s) for s, e, _ in stamps)
        rows.append({"forward_s": t_fwd - t0, "backward_s": t_bwd - t_fwd, "step_after_backward_s": t_end - t_bwd,
                     "groups": len(stamps), "params_in_groups": n, "adam_s": sum(e - s for s, e, _ in stamps),
                     "adam_s_during_backward": before,
                     "first_group_start_after_fwd_s": (stamps[0][0] - t_fwd) if stamps else None,
                     "host_stats": opt.stats.take()})
    del model, opt
    torch.cuda.empty_cache()
    return rows[-1]


def run_pair(model, batch, spec, out, steps, timeout_s):
    from sapp.api import search
    rows = []
    for where in ("host", "device"):
        cons = {"dp": 1, "tp": 1, "pp": 1, "zero": 0, "placement": {"optimizer": where}}
        row = {"model": model, "batch": batch, "optimizer": where}
        try:
            plan = search(model, spec, global_batch=batch, constraints=cons)
        except Exception as e:      # a plan that does not fit is a row, not a crash
            row["status"] = f"search: {e}"
            rows.append(row)
            continue
        path = os.path.join(out, f"offload-plan-{model}-{where}.json")
        plan.save(path)
        pr = plan["predicted"]
        comp = ((plan.placement or {}).get("predicted") or {}).get("components", {}).get("optimizer", {})
        row.update(predicted_s=pr["step_time_s"], predicted_mem=pr["peak_memory_bytes"],
                   recompute=plan["recompute"].get("default"), micro_batches=plan.pipeline.get("micro_batches"),
                   priced_host=comp)
        res, status, row["wall_s"] = run_saved_plan(path, model, 1, steps, path.replace("plan", "run"), timeout_s,
                                                    ("--timeout", "240"))
        if res is None:
            row["status"] = status
        else:
            row.update(status="ok", measured_s=res["measured_step_time_s"], step_times_s=res.get("step_times_s"),
                       peak_allocated=res.get("peak_memory_bytes"))
            row["error"] = row["predicted_s"] / row["measured_s"] - 1
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "priced_host"}), file=sys.stderr, flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_offload", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--models", default="gpt3-350m:4,gpt3-1.3b:4")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per `sapp run`")
    ap.add_argument("--timeline-only", default="", help="models (comma-separated) to time without the plan runs")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench.gpu_offload needs a CUDA GPU; this machine has none", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    h2d, d2h, adam = host_rates(torch)
    spec = cluster_spec(h2d, adam)
    report = {"device": torch.cuda.get_device_name(0), "cpu_threads": torch.get_num_threads(), "h2d_Bps": h2d,
              "d2h_Bps": d2h, "cpu_adam_params_per_s": adam, "cluster": spec, "models": {}}
    print(json.dumps({k: v for k, v in report.items() if k != "models"}), file=sys.stderr, flush=True)
    for item in args.models.split(","):
        model, batch = item.split(":")
        entry = report["models"][model] = {"batch": int(batch)}
        try:
            entry["timeline"] = timeline(torch, model, int(batch))
        except Exception as e:
            entry["timeline"] = {"status": f"{type(e).__name__}: {e}"[:300]}
        print(model, "timeline", json.dumps(entry["timeline"]), file=sys.stderr, flush=True)
        skip = model in args.timeline_only.split(",")
        entry["runs"] = [] if skip else run_pair(model, int(batch), spec, args.out, args.steps, args.timeout)
        ok = {r["optimizer"]: r for r in entry["runs"] if r.get("status") == "ok"}
        if len(ok) == 2:
            entry["priced_winner"] = min(ok, key=lambda k: ok[k]["predicted_s"])
            entry["measured_winner"] = min(ok, key=lambda k: ok[k]["measured_s"])
    with open(os.path.join(args.out, "gpu_offload.json"), "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    lines = [f"{report['device']}, {report['cpu_threads']} CPU threads: pinned h2d {h2d / 1e9:.1f} GB/s, d2h "
             f"{d2h / 1e9:.1f} GB/s, fused CPU Adam {adam / 1e9:.2f} G params/s; cluster `{spec}`", "",
             "| model | optimizer | predicted ms | measured ms | error | priced host exposed ms | peak GB pred/meas |",
             "|---|---|---:|---:|---:|---:|---|"]
    for model, entry in report["models"].items():
        for r in entry["runs"]:
            if r.get("status") != "ok":
                lines.append(f"| {model} b{entry['batch']} | {r['optimizer']} | | | | | {r.get('status', '')[:120]} |")
                continue
            exp = r["priced_host"].get("exposed_s")
            lines.append(f"| {model} b{entry['batch']} | {r['optimizer']} | {r['predicted_s'] * 1e3:.1f} | "
                         f"{r['measured_s'] * 1e3:.1f} | {r['error'] * 100:+.0f}% | "
                         f"{'' if exp is None else f'{exp * 1e3:.1f}'} | {r['predicted_mem'] / 1e9:.1f} / "
                         f"{(r.get('peak_allocated') or 0) / 1e9:.1f} |")
        if "priced_winner" in entry:
            lines.append(f"| {model} | winner | priced: {entry['priced_winner']} | measured: {entry['measured_winner']} "
                         f"| | | |")
    md = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "gpu_offload.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
