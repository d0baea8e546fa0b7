"""Predicted vs measured step times of emitted plans on one real GPU.

    python -m bench.gpu_check [--steps 8] [--out bench/results] [--quick]

Needs a CUDA device (refuses in one line without one).  For each zoo model x batch x pin below:
  1. search the plan on the data-sheet preset of this GPU (`h100-80g:gpus=1`, `h200:gpus=1`, ...);
  2. run it with `sapp run PLAN --model M --steps N` (one process, bf16 autocast as the plan says);
  3. compare the measured median step time with the preset's prediction, and with the same plan
     re-scored (`sapp.evaluate`) on a cluster `sapp calibrate --procs 1` measured on this machine.
Writes gpu_check.{md,json} in --out.  Single GPU: collectives are not exercised here."""
from __future__ import annotations

import argparse
import json
import os
import sys

from .sapp_run import run_saved_plan

_ONE = {"dp": 1, "tp": 1, "pp": 1}
# (label, model, global batch, constraints).  Recompute left free lets the search pick what fits.
VARIANTS = [
    ("gpt3-125m b8 none", "gpt3-125m", 8, dict(_ONE, recompute="none")),
    ("gpt3-350m b4", "gpt3-350m", 4, dict(_ONE)),
    ("gpt3-1.3b b4", "gpt3-1.3b", 4, dict(_ONE)),
    ("gpt3-760m b4", "gpt3-760m", 4, dict(_ONE)),
    ("gpt3-125m b8 full", "gpt3-125m", 8, dict(_ONE, recompute="full")),
    ("gpt3-1.3b b8 full", "gpt3-1.3b", 8, dict(_ONE, recompute="full")),
    ("bert-large b32", "bert-large", 32, dict(_ONE)),
    ("resnet50 b128", "resnet50", 128, dict(_ONE)),
]
QUICK = {"gpt3-125m b8 none", "gpt3-350m b4", "gpt3-1.3b b4"}


def preset_for(device_name: str) -> str:
    name = device_name.upper()
    if "H200" in name:
        return "h200"
    if "H100" in name:
        return "h100-80g"
    if "V100" in name:
        return "v100-32g"
    return "a100-80g"


def run_one(label, model, batch, cons, preset, calibrated, out, steps, timeout_s):
    import sapp
    from sapp.api import evaluate, search
    slug = label.replace(" ", "_")
    plan_path, res_path = os.path.join(out, f"gpu-plan-{slug}.json"), os.path.join(out, f"gpu-run-{slug}.json")
    row = {"label": label, "model": model, "global_batch": batch, "constraints": cons}
    try:
        plan = search(model, preset, global_batch=batch, constraints=cons)
    except sapp.SappError as e:
        row["status"] = f"search failed: {e}"
        return row
    plan.save(plan_path)
    pr = plan["predicted"]
    row.update(predicted_s=pr["step_time_s"], predicted_mem=pr["peak_memory_bytes"],
               recompute=plan["recompute"].get("default"), precision=plan["settings"]["precision"])
    if calibrated is not None:
        try:
            row["calibrated_s"] = evaluate(model, calibrated, plan)["step_time_s"]
        except sapp.SappError as e:
            row["calibrated_error"] = str(e)
    res, status, row["wall_s"] = run_saved_plan(plan_path, model, 1, steps, res_path, timeout_s, ("--timeout", "120"))
    if res is None:
        row["status"] = status
        return row
    row.update(measured_s=res["measured_step_time_s"], step_times_s=res.get("step_times_s"),
               peak_allocated=res.get("peak_memory_bytes"), status="ok")
    row["error"] = row["predicted_s"] / row["measured_s"] - 1.0
    if "calibrated_s" in row:
        row["calibrated_err"] = row["calibrated_s"] / row["measured_s"] - 1.0
    return row


def to_markdown(rows, device, preset, calibrated, command):
    out = [f"Command: `{command}` on {device}", "",
           f"- preset `{preset.name}`: peak {preset.peak_flops / 1e12:.0f} TFLOP/s x {preset.compute_efficiency:.0%}, "
           f"memory {preset.mem_bandwidth / 1e12:.2f} TB/s x {preset.memory_efficiency:.0%}"]
    if calibrated is not None:
        out.append(f"- calibrated: {calibrated.notes}")
    out += ["", "| plan | recompute | predicted ms (preset) | predicted ms (calibrated) | measured ms | error preset | "
            "error calibrated | predicted / measured peak GB |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r.get("status") != "ok":
            out.append(f"| {r['label']} | | | | | | | {r.get('status', '')[:160]} |")
            continue
        cal = f"{r['calibrated_s'] * 1e3:.1f}" if "calibrated_s" in r else "-"
        cal_e = f"{r['calibrated_err'] * 100:+.0f}%" if "calibrated_err" in r else "-"
        mem = (f"{r['predicted_mem'] / 1e9:.1f} / {r['peak_allocated'] / 1e9:.1f}" if r.get("peak_allocated")
               else f"{r['predicted_mem'] / 1e9:.1f} / -")
        out.append(f"| {r['label']} | {r['recompute']} | {r['predicted_s'] * 1e3:.1f} | {cal} | "
                   f"{r['measured_s'] * 1e3:.1f} | {r['error'] * 100:+.0f}% | {cal_e} | {mem} |")
    ok = [r for r in rows if r.get("status") == "ok"]
    if len(ok) >= 3:
        from scipy.stats import spearmanr
        out.append("")
        out.append(f"- Spearman (preset prediction vs measured): "
                   f"{spearmanr([r['predicted_s'] for r in ok], [r['measured_s'] for r in ok]).statistic:.3f}")
        cal = [r for r in ok if "calibrated_s" in r]
        if len(cal) >= 3:
            out.append(f"- Spearman (calibrated prediction vs measured): "
                       f"{spearmanr([r['calibrated_s'] for r in cal], [r['measured_s'] for r in cal]).statistic:.3f}")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-calibrate", action="store_true", help="compare with the preset only")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per `sapp run`")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench.gpu_check needs a CUDA GPU; this machine has none (use bench.calibration_accuracy on CPU)",
              file=sys.stderr)
        return 2
    from sapp import Cluster
    os.makedirs(args.out, exist_ok=True)
    device = torch.cuda.get_device_name(0)
    preset = Cluster.parse(f"{preset_for(device)}:gpus=1")
    calibrated = None
    if not args.no_calibrate:
        from sapp.calibrate import calibrate
        calibrated, _ = calibrate(procs=1, timeout_s=300, name="gpu1-calibrated")
        calibrated.save(os.path.join(args.out, "cluster-gpu1.json"))
        print(f"calibrated: {calibrated.notes}", file=sys.stderr, flush=True)
    rows = []
    for label, model, batch, cons in VARIANTS:
        if args.quick and label not in QUICK:
            continue
        r = run_one(label, model, batch, cons, preset, calibrated, args.out, args.steps, args.timeout)
        rows.append(r)
        msg = (f"predicted {r['predicted_s'] * 1e3:.1f} ms measured {r['measured_s'] * 1e3:.1f} ms ({r['error'] * 100:+.0f}%)"
               if r.get("status") == "ok" else r.get("status", "")[:300])
        print(f"{label:22} {msg}", file=sys.stderr, flush=True)
    command = "python -m bench.gpu_check" + (" --quick" if args.quick else "") + f" --steps {args.steps}"
    md = to_markdown(rows, device, preset, calibrated, command)
    with open(os.path.join(args.out, "gpu_check.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump({"device": device, "rows": rows, "preset": preset.to_dict(),
                   "calibrated": calibrated.to_dict() if calibrated else None}, f, indent=1, sort_keys=True)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
