"""How well does the cost model, fed a calibrated cluster, predict measured step times?

    python -m bench.calibration_accuracy [--quick] [--steps 6] [--out bench/results]

1. `sapp calibrate` this machine for 2 and for 4 processes (contention differs, so each device count
   gets its own cluster file);
2. search plans for small zoo models with pinned dp / tp / pp / ZeRO / recompute variations;
3. run each with `sapp run PLAN --model NAME --steps N --out RESULT` (torchrun, gloo) and compare the
   measured median step time with the predicted one: per-plan error and the Spearman rank
   correlation over all plans.  Targets: within +-25 %, Spearman >= 0.9.
Writes calibration_accuracy.{md,json} in --out.

Reading the figures (bench/RESULTS.md §2):
What it does not show:
- A stable box.  Five runs that day met the raw targets in three; the box's speed between calibration
  and run moved by more than the tolerance (paired drift per round 0.79-1.68).
- GPUs: this is CPU and gloo only; §4 has the device rows.
- Remaining biases: ZeRO-3 (FSDP2) is under-predicted in every run (-15..-26% raw); a recomputed
  forward inside backward costs ~1.3x the forward it repeats (checkpoint's hooks and autograd
  rebuilding the block's graph) where the model charges 1x; gloo p2p through the pipelining runtime
  measured 0.35 ms per crossing at 2 KB and 2 ms at 1 MB."""
from __future__ import annotations

import argparse
import json
import os
import sys

from .sapp_run import run_paired, run_saved_plan

# (label, model, processes, global batch, constraints).  Batches vary so step times spread over a
# decade: a rank correlation over plans that all take the same time would measure only noise.
_DP2 = {"dp": 2, "tp": 1, "pp": 1, "zero": 0, "recompute": "none"}
VARIANTS = [
    ("gpt-small dp2 b8", "gpt-small", 2, 8, _DP2),
    ("gpt-small dp2 b16", "gpt-small", 2, 16, _DP2),
    ("gpt-small dp2 b32", "gpt-small", 2, 32, _DP2),
    ("gpt-small dp2 b64", "gpt-small", 2, 64, _DP2),
    ("gpt-small dp2 recompute", "gpt-small", 2, 32, dict(_DP2, recompute="full")),
    ("gpt-small dp2 zero3", "gpt-small", 2, 32, dict(_DP2, zero=3)),
    ("gpt-small tp2", "gpt-small", 2, 32, {"dp": 1, "tp": 2, "pp": 1, "zero": 0, "recompute": "none"}),
    ("gpt-small pp2 1f1b m4", "gpt-small", 2, 32, {"dp": 1, "tp": 1, "pp": 2, "schedule": "1f1b", "micro_batches": 4,
                                                    "zero": 0, "recompute": "none"}),
    ("gpt-small dp2 tp2", "gpt-small", 4, 32, {"dp": 2, "tp": 2, "pp": 1, "zero": 0, "recompute": "none"}),
    ("gpt-small pp2 dp2", "gpt-small", 4, 32, {"dp": 2, "tp": 1, "pp": 2, "schedule": "1f1b", "micro_batches": 4,
                                                "zero": 0, "recompute": "none"}),
    ("gpt-small dp4 b64", "gpt-small", 4, 64, {"dp": 4, "tp": 1, "pp": 1, "zero": 0, "recompute": "none"}),
    ("mlp dp2", "mlp", 2, 256, _DP2),
]
QUICK = {"gpt-small dp2 b8", "gpt-small dp2 b32", "gpt-small dp2 zero3", "gpt-small tp2", "gpt-small pp2 1f1b m4",
         "gpt-small dp2 tp2"}


def spearman(xs, ys):
    from scipy.stats import spearmanr
    if len(xs) < 3:
        return float("nan")
    return float(spearmanr(xs, ys).statistic)


def calibrated_cluster(procs, out, quick):
    """(cluster, its file, the calibration's reference-block seconds for the drift probe)."""
    from sapp.calibrate import calibrate, reference_seconds
    path = os.path.join(out, f"cluster-cpu{procs}.json")
    cluster, raw = calibrate(procs=procs, quick=quick, timeout_s=240, name=f"cpu{procs}-calibrated")
    cluster.save(path)
    return cluster, path, reference_seconds(raw)


def drift(procs, ref_s):
    """How much slower (> 1) the machine runs now than when calibrated: the reference block timed
    again in `procs` processes right before a run, over the calibration's figure.  None without one."""
    if not ref_s:
        return None
    from sapp.calibrate import probe
    try:
        return probe(procs) / ref_s
    except Exception:                  # a probe is a nicety: never lose the run for it
        return None


_GRAPHS = {}


def _search(model, cluster, batch, cons):
    # sapp.api.search, not sapp.search: importing the sapp.search package rebinds that name
    from sapp.api import capture_graph, resolve_model, search
    if model not in _GRAPHS:
        _GRAPHS[model] = capture_graph(resolve_model(model)[0])[0]
    return search(model, cluster, global_batch=batch, constraints=cons, graph=_GRAPHS[model])


def step_statistics(res):
    """(median, best) of the steady steps of a `sapp run --out` result (the first step is warm-up).
    The median is what a user sees (and what calibration's reference step is); the best is the
    machine at its least disturbed, on a box whose neighbours come and go."""
    times = res.get("step_times_s") or []
    # bench.paired_run leaves its warm-up steps untimed; `sapp run` times its first step too
    steady = times[1:] if len(times) > 1 and "reference_s" not in res else times
    if not steady:
        return res["measured_step_time_s"], res["measured_step_time_s"]
    return res["measured_step_time_s"], min(steady)


def _paths(out, label):
    """(plan file, run result file) of one variant in `out`."""
    slug = label.replace(" ", "_")
    return os.path.join(out, f"plan-{slug}.json"), os.path.join(out, f"run-{slug}.json")


def _run(plan_path, model, procs, steps, res_path, timeout_s, paired):
    if paired:
        return run_paired(plan_path, model, procs, steps, res_path, timeout_s)
    return run_saved_plan(plan_path, model, procs, steps, res_path, timeout_s)


def run_plan(label, model, procs, batch, cons, cluster, out, steps, timeout_s, ref_s=None, probe=True,
             paired=False):
    import sapp
    plan_path, res_path = _paths(out, label)
    row = {"label": label, "model": model, "procs": procs, "global_batch": batch, "constraints": cons}
    try:
        plan = _search(model, cluster, batch, cons)
    except sapp.SappError as e:
        row["status"] = f"search failed: {e}"
        return row
    except Exception as e:            # another package's bug: record it, keep measuring the rest
        row["status"] = f"search crashed: {type(e).__name__}: {e}"
        return row
    plan.save(plan_path)
    pred = plan["predicted"]["step_time_s"]
    row["predicted"] = {k: plan["predicted"].get(k) for k in ("compute_s", "comm_s", "bubble_s", "host_s")}
    factor = drift(procs, ref_s) if probe else None
    res, status, row["wall_s"] = _run(plan_path, model, procs, steps, res_path, timeout_s, paired)
    if res is None:
        row["status"] = status
        row["predicted_s"] = pred
        return row
    row["rounds"] = [round_record(pred, factor, res, ref_s)]
    row["status"] = "ok"
    return row


def round_record(pred, factor, res, ref_s=None):
    med, best = step_statistics(res)
    rec = {"predicted_s": pred, "median_s": med, "best_s": best, "step_times_s": res.get("step_times_s")}
    if factor:
        rec["drift"] = factor
        rec["corrected_s"] = pred * factor
    if ref_s and res.get("reference_median_s"):
        # the machine's speed during the plan's steps (the reference timed between them, same
        # processes) over its speed at calibration
        rec["paired_drift"] = res["reference_median_s"] / ref_s
        rec["paired_s"] = pred * rec["paired_drift"]
    return rec


def measure_again(row, cluster, out, steps, timeout_s, ref_s=None, probe=True, paired=False):
    """Another round for a plan `run_plan` made: re-score it on this round's calibrated cluster and
    run it again.  Returns the round's record or None."""
    from sapp.api import evaluate
    from sapp.plan import Plan
    plan_path, res_path = _paths(out, row["label"])
    plan = Plan.load(plan_path)
    pred = evaluate(row["model"], cluster, plan, graph=_GRAPHS.get(row["model"]))["step_time_s"]
    factor = drift(row["procs"], ref_s) if probe else None
    res, _, _ = _run(plan_path, row["model"], row["procs"], steps, res_path, timeout_s, paired)
    return round_record(pred, factor, res, ref_s) if res else None


# statistic -> (the round's prediction, the round's measurement) it compares
STATISTICS = {"median": ("predicted_s", "median_s"), "best": ("predicted_s", "best_s"),
              # the prediction scaled by the drift probe taken just before the run, against the median step
              "drift-corrected": ("corrected_s", "median_s"),
              # scaled by the reference block timed between the plan's steps in the same processes (--paired)
              "paired": ("paired_s", "median_s")}


def _pairs(row, st):
    pk, mk = STATISTICS[st]
    return [(r[pk], r[mk]) for r in row["rounds"] if pk in r]


def combine_rounds(row):
    """Per plan over rounds and per statistic: the median of the paired errors (each round's
    prediction from that round's calibration, against that round's run), and the medians of the
    times."""
    import statistics
    row["predicted_s"] = statistics.median(r["predicted_s"] for r in row["rounds"])
    for st in STATISTICS:
        pairs = _pairs(row, st)
        if pairs:
            row[f"error_{st}"] = statistics.median(p / m - 1.0 for p, m in pairs)
            row[f"measured_{st}_s"] = statistics.median(m for _, m in pairs)
            row[f"predicted_{st}_s"] = statistics.median(p for p, _ in pairs)


def summary(rows, st):
    ok = [r for r in rows if r["status"] == "ok" and f"error_{st}" in r]
    if not ok:
        return None
    errs = sorted(abs(r[f"error_{st}"]) for r in ok)
    meas, pred = f"measured_{st}_s", f"predicted_{st}_s"
    return {"n": len(ok), "within": sum(1 for e in errs if e <= 0.25),
            "median_abs": errs[len(errs) // 2] if errs else float("nan"),
            "worst": max((r[f"error_{st}"] for r in ok), key=abs, default=float("nan")),
            "spearman": spearman([r[pred] for r in ok], [r[meas] for r in ok]),
            "spearman_by_model": {m: spearman([r[pred] for r in ok if r["model"] == m],
                                              [r[meas] for r in ok if r["model"] == m])
                                  for m in sorted({r["model"] for r in ok})}}


_TITLES = {"median": "the median step (raw prediction)", "best": "the best step (raw prediction)",
           "drift-corrected": "the median step, prediction scaled by the drift probe",
           "paired": "the median step, prediction scaled by the reference block timed between the plan's steps"}


def _err(x, st):
    pk, mk = STATISTICS[st]
    return f"{(x[pk] / x[mk] - 1) * 100:+.0f}%" if pk in x else "-"


def to_markdown(rows, clusters, command, stats):
    out = [f"Command: `{command}`" + (f" on {stats['machine']}" if stats.get("machine") else ""), ""]
    for procs, c in sorted(clusters.items()):
        out.append(f"- calibrated {procs} processes: GEMM {c.peak_flops / 1e9:.1f} GFLOP/s per process "
                   f"(typical {c.compute_efficiency:.0%}), memory {c.mem_bandwidth / 1e9:.2f} GB/s "
                   f"(element-wise {c.memory_efficiency:.0%}), {c.op_overhead * 1e6:.0f} us per graph op, "
                   f"all_reduce alpha {c.intra_latency * 1e6:.0f} us, beta {c.intra_bw / 1e9:.2f} GB/s")
    sts = [st for st in STATISTICS if stats.get(st)]
    paired = "paired" in sts
    drift_how = ("the reference block timed between the plan's steps in the same processes (bench.paired_run)"
                 if paired else "the reference block timed again in as many processes just before the run")
    out += ["", "Measured: per run the median step (what a user sees) and the best step (the machine at its least "
            f"disturbed). Drift: {drift_how}, over its time at calibration (> 1: the machine is slower now). "
            "Errors are medians over rounds of predicted / measured - 1.", "",
            "| plan | procs | batch | predicted ms | median ms | error | best ms | error | drift | "
            + ("paired" if paired else "drift-corrected") + " error "
            "| per-round errors (" + "; ".join(sts) + ") | compute / comm / bubble predicted ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|"]
    for r in rows:
        if r["status"] == "ok":
            p = r["predicted"]
            parts = " / ".join(f"{(p.get(k) or 0) * 1e3:.1f}" for k in ("compute_s", "comm_s", "bubble_s"))
            rounds = "; ".join(" ".join(_err(x, st) for x in r["rounds"]) for st in sts)
            drifts = " ".join(f"{x.get('drift') or x.get('paired_drift'):.2f}" for x in r["rounds"]
                              if x.get("drift") or x.get("paired_drift")) or "-"
            key = "error_drift-corrected" if "error_drift-corrected" in r else "error_paired"
            corr = f"{r[key] * 100:+.0f}%" if key in r else "-"
            out.append(f"| {r['label']} | {r['procs']} | {r['global_batch']} | {r['predicted_s'] * 1e3:.1f} | "
                       f"{r['measured_median_s'] * 1e3:.1f} | {r['error_median'] * 100:+.0f}% | "
                       f"{r['measured_best_s'] * 1e3:.1f} | {r['error_best'] * 100:+.0f}% | {drifts} | {corr} | "
                       f"{rounds} | {parts} |")
        else:
            out.append(f"| {r['label']} | {r['procs']} | {r['global_batch']} | "
                       f"{r.get('predicted_s', float('nan')) * 1e3:.1f} | - | - | - | - | - | - | - | {r['status'][:120]} |")
    for st in sts:
        s = stats[st]
        out += ["", f"Against {_TITLES[st]}:",
                f"- plans measured: {s['n']} of {len(rows)}",
                f"- within +-25 %: {s['within']} of {s['n']}; median |error| {s['median_abs'] * 100:.0f}%, "
                f"worst {s['worst'] * 100:+.0f}%",
                f"- Spearman rank correlation (predicted vs measured): {s['spearman']:.3f}"
                + "".join(f"; {m} only {v:.3f}" for m, v in (s.get("spearman_by_model") or {}).items() if v == v)]
    return "\n".join(out) + "\n"


def _line(rd):
    return (f"predicted {rd['predicted_s'] * 1e3:.1f} ms, measured median {rd['median_s'] * 1e3:.1f} ms "
            f"({(rd['predicted_s'] / rd['median_s'] - 1) * 100:+.0f}%), best {rd['best_s'] * 1e3:.1f} ms "
            f"({(rd['predicted_s'] / rd['best_s'] - 1) * 100:+.0f}%)"
            + (f", drift {rd['drift']:.2f} ({(rd['corrected_s'] / rd['median_s'] - 1) * 100:+.0f}%)" if rd.get("drift") else "")
            + (f", paired drift {rd['paired_drift']:.2f} ({(rd['paired_s'] / rd['median_s'] - 1) * 100:+.0f}%)"
               if rd.get("paired_drift") else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.calibration_accuracy", description="Predicted vs measured step times of plans on a calibrated CPU cluster.")
    ap.add_argument("--quick", action="store_true", help="quick calibration and 6 plans")
    ap.add_argument("--steps", type=int, default=8, help="training steps per plan (the first is warm-up)")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per `sapp run`")
    ap.add_argument("--cluster2", help="use this calibrated cluster JSON for 2 processes instead of measuring")
    ap.add_argument("--cluster4", help="use this calibrated cluster JSON for 4 processes instead of measuring")
    ap.add_argument("--rounds", type=int, default=1,
                    help="calibrate and run every plan this many times, interleaved, and report per plan the "
                         "median of the paired errors (a shared machine's load drifts within minutes)")
    ap.add_argument("--no-probe", action="store_true",
                    help="skip the drift probe (the reference block timed again before each run, ~4 s)")
    ap.add_argument("--paired", action="store_true",
                    help="run each plan with bench.paired_run instead of `sapp run`: its steps alternate with the "
                         "calibration's reference block in the same processes, and a 'paired' statistic scales "
                         "the prediction by the reference's time then over its time at calibration (implies "
                         "--no-probe)")
    args = ap.parse_args(argv)
    from sapp import Cluster
    os.makedirs(args.out, exist_ok=True)
    variants = [v for v in VARIANTS if not args.quick or v[0] in QUICK]
    clusters, refs = {}, {}
    for procs in sorted({v[2] for v in variants}):
        given = getattr(args, f"cluster{procs}", None)
        if given:
            clusters[procs] = Cluster.load(given)
        else:
            clusters[procs], path, refs[procs] = calibrated_cluster(procs, args.out, args.quick)
        print(f"cluster for {procs} processes: {clusters[procs].notes}", file=sys.stderr, flush=True)
    probe = not (args.no_probe or args.paired)
    rows = []
    for label, model, procs, batch, cons in variants:
        r = run_plan(label, model, procs, batch, cons, clusters[procs], args.out, args.steps, args.timeout,
                     refs.get(procs), probe=probe, paired=args.paired)
        rows.append(r)
        msg = _line(r["rounds"][0]) if r["status"] == "ok" else r["status"][:200]
        print(f"{label:28} {msg}", file=sys.stderr, flush=True)
    for rnd in range(2, args.rounds + 1):
        for procs in sorted(clusters):
            if not getattr(args, f"cluster{procs}", None):
                clusters[procs], _, refs[procs] = calibrated_cluster(procs, args.out, args.quick)
        for r in rows:
            if r["status"] != "ok":
                continue
            got = measure_again(r, clusters[r["procs"]], args.out, args.steps, args.timeout, refs.get(r["procs"]),
                                probe=probe, paired=args.paired)
            if got:
                r["rounds"].append(got)
                print(f"{r['label']:28} round {rnd}: {_line(got)}", file=sys.stderr, flush=True)
    for r in rows:
        if r["status"] == "ok":
            combine_rounds(r)
    stats = {st: summary(rows, st) for st in STATISTICS}
    command = ("python -m bench.calibration_accuracy" + (" --quick" if args.quick else "") + f" --steps {args.steps}"
               + (f" --rounds {args.rounds}" if args.rounds > 1 else "") + (" --paired" if args.paired else ""))
    import torch
    machine = (f"{len(os.sched_getaffinity(0))} usable CPUs of {os.cpu_count()} (affinity), torch {torch.__version__}, "
               f"{os.uname().machine}")
    stats["machine"] = machine
    md = to_markdown(rows, clusters, command, stats)
    with open(os.path.join(args.out, "calibration_accuracy.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "calibration_accuracy.json"), "w") as f:
        json.dump({"command": command, "stats": stats, "rows": rows,
                   "clusters": {str(k): c.to_dict() for k, c in clusters.items()}}, f, indent=1, sort_keys=True)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
