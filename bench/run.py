"""`python -m bench [--quick] [--out bench/results]`: the model zoo x clusters x device counts through
sapp.search, next to the baselines of bench/baselines.py and (where H3's bench/joint_exhaustive.py can
afford it) the exhaustive optimum.  Writes results.md / results.json / results.csv.

Headline columns are speedups: baseline step time / sapp step time (> 1: sapp's plan is faster; the
same cost model scores both).  An infeasible baseline shows as OOM.

Reading the figures (bench/RESULTS.md §1):
What it shows:
- sapp is never slower than a baseline, by construction (each baseline is a constrained version of the
  same search), and it equals the exhaustive optimum wherever that ran (1.00), or beats it (0.98) where
  recomputing only some blocks does better than any one policy for all blocks.
- The gains are largest where a hand recipe does not fit the problem's shape: Megatron's tp = 8 on
  ResNet-50 (7.75-7.99x) and BERT-large (1.91-1.97x), ZeRO-3 at 512-1024 devices (up to 3.36x), where
  parameter traffic dominates.  Against Megatron on GPT the gain is 1.08-1.54x: that recipe is close to
  optimal there.

What it does not show: any measured time.  Every column is priced by the same cost model, so the table
measures the search given the model; how close the model is to real runs is in §8 (published runs),
§6 (the truth matrix) and §4 (one GPU).  A full `python -m bench` takes about 200 s on an idle CPU box
and over 20 minutes on the loaded one (about a minute a case); search seconds per case are in its
generated output."""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time

from sapp import Cluster
from sapp.errors import ConstraintError, InfeasibleError, SappError

from .baselines import BASELINES, run_baseline

# (model, global batch, cluster preset, device counts).  Batches follow the papers' settings where
# there is one (GPT-3: 1536 for 175B; BERT-large 1024 at seq 512 would be 256 per...); device counts
# span one node to 4096 devices.
FULL_CASES = [
    ("gpt3-1.3b", 512, "a100-80g", (8, 64, 512)),
    ("gpt3-13b", 1024, "a100-80g", (8, 64, 512)),
    ("gpt3-175b", 1536, "a100-80g", (512, 1024, 4096)),
    ("gpt3-6.7b", 1024, "v100-32g", (64, 512)),
    ("gpt3-13b", 1024, "h100-80g", (64, 1024)),
    ("bert-large", 1024, "a100-80g", (8, 64)),
    ("resnet50", 2048, "v100-32g", (8, 64)),
    ("wide-deep", 16384, "a100-80g", (8, 64)),
]
QUICK_CASES = [
    ("gpt3-1.3b", 512, "a100-80g", (8, 64)),
    ("bert-large", 256, "a100-80g", (8,)),
    ("resnet50", 256, "v100-32g", (8,)),
]


def cluster_for(preset, devices):
    sep = "," if ":" in preset else ":"
    return Cluster.parse(f"{preset}{sep}devices={devices}")


class Searcher:
    """sapp.api.search with each model built (meta device: no memory) and captured once; baselines
    and device counts reuse the graph.  `capture_s` records the one-off capture time per model."""

    def __init__(self):
        self._models, self._graphs, self.capture_s = {}, {}, {}
        self.exhaustive = None

    def model(self, name):
        if name not in self._models:
            import sapp.models
            self._models[name] = sapp.models.get(name, device="meta")
        return self._models[name]

    def graph(self, name):
        if name not in self._graphs:
            from sapp.api import capture_graph
            self._graphs[name], self.capture_s[name] = capture_graph(self.model(name))
        return self._graphs[name]

    def __call__(self, name, cluster, global_batch, constraints=None):
        # sapp.api.search, not sapp.search: importing the sapp.search package rebinds that name
        from sapp.api import search
        return search(name, cluster, global_batch=global_batch, constraints=constraints or {},
                      graph=self.graph(name))


def _summary(plan):
    pr, par, pipe = plan["predicted"], plan["parallel"], plan["pipeline"]
    rc = plan["recompute"] or {}
    blocks = rc.get("blocks") or {}
    rc_s = rc.get("default", "none")
    if blocks:
        counts = {}
        for v in blocks.values():
            counts[v] = counts.get(v, 0) + 1
        rc_s = "/".join(f"{k[0]}{n}" for k, n in sorted(counts.items()))
    host = sorted(k for k, g in ((plan["placement"] or {}).get("groups") or {}).items()
                  if "host" in (g.get("weights"), g.get("optimizer"), g.get("grads")))
    stages = sorted(pipe.get("stages") or [], key=lambda st: st.get("index", 0))
    per_dev = {}
    for st in stages:            # interleaved plans list virtual stages: count blocks per device stage
        i = st.get("device_stage", st.get("index", 0))
        per_dev[i] = per_dev.get(i, 0) + len(st.get("blocks") or [])
    return {"stage_blocks": "/".join(str(per_dev[i]) for i in sorted(per_dev)) or "-",
            "step_s": pr["step_time_s"], "mfu": pr.get("mfu"), "peak_bytes": pr.get("peak_memory_bytes"),
            "dp": par["dp"], "tp": par["tp"], "pp": par["pp"], "schedule": pipe.get("schedule"),
            "m": pipe.get("micro_batches"), "v": pipe.get("virtual_chunks", 1), "recompute": rc_s,
            "zero": plan["zero"], "placement": "host:" + ",".join(host) if host else "device"}


def run_case(searcher, model, batch, preset, devices, *, baselines=BASELINES, exhaustive=True):
    cluster = cluster_for(preset, devices)
    row = {"model": model, "cluster": preset, "devices": devices, "global_batch": batch,
           "capacity_bytes": cluster.device_memory}
    if hasattr(searcher, "graph"):
        searcher.graph(model)           # capture outside the timed search
    t0 = time.perf_counter()
    try:
        plan = searcher(model, cluster, batch)
        row["search_s"] = time.perf_counter() - t0
        row["sapp"] = _summary(plan)
        row["sapp"]["throughput"] = batch / plan["predicted"]["step_time_s"]
        row["status"] = "ok"
        row["capacity_bytes"] = plan["predicted"].get("capacity_bytes") or row["capacity_bytes"]
        if not _valid(plan):
            row["status"] = f"invalid: predicted step time {plan['predicted']['step_time_s']} s is not positive (cost model bug)"
            plan = None
    except InfeasibleError as e:
        row["search_s"] = time.perf_counter() - t0
        row["status"] = f"OOM: {e}"
        plan = None
    except SappError as e:
        row["search_s"] = time.perf_counter() - t0
        row["status"] = f"error: {e}"
        plan = None
    for name in baselines:
        t1 = time.perf_counter()
        bplan, status, cons = run_baseline(name, searcher, model, cluster, devices, batch)
        entry = {"status": status, "search_s": time.perf_counter() - t1}
        if bplan is not None and not _valid(bplan):
            entry["status"] = f"invalid: predicted step time {bplan['predicted']['step_time_s']} s"
        elif bplan is not None:
            entry.update(_summary(bplan))
            d = getattr(bplan, "_d", bplan)
            # a pinned tp that shards nothing (every tp rank computes the whole model): the free search
            # never spends devices on it where they can serve dp or pp (issue 26), so it is no bar for sapp
            entry["idle_tp"] = d["parallel"]["tp"] > 1 and not d.get("tp_modules")
            if plan is not None:
                entry["speedup"] = bplan["predicted"]["step_time_s"] / plan["predicted"]["step_time_s"]
        row[name] = entry
    if exhaustive and plan is not None:
        row["exhaustive"] = _exhaustive(searcher, model, cluster, batch, plan)
    return row


def _valid(plan):
    st = plan["predicted"].get("step_time_s")
    return isinstance(st, (int, float)) and st > 0 and st == st


def _exhaustive(searcher, model, cluster, batch, plan):
    """The exhaustive optimum from H3's bench/joint_exhaustive.py when it exists and the case is small
    enough for it; else a reason."""
    try:
        from . import joint_exhaustive
    except ImportError:
        return {"status": "n/a: bench/joint_exhaustive.py not available"}
    fn = getattr(joint_exhaustive, "optimum", None)
    if fn is None:
        return {"status": "n/a: bench/joint_exhaustive.py has no optimum()"}
    t0 = time.perf_counter()
    target = searcher.graph(model) if hasattr(searcher, "graph") else searcher.model(model)
    try:
        res = fn(target, cluster, global_batch=batch)
    except SappError as e:
        return {"status": f"n/a: {e}"}
    except Exception as e:           # bench/joint_exhaustive.py is another engineer's: report, go on
        return {"status": f"error: {type(e).__name__}: {e}"}
    if res is None:
        return {"status": "n/a: too large for exhaustive search"}
    step = res["step_time_s"] if isinstance(res, dict) else res["predicted"]["step_time_s"]
    if not step > 0:
        return {"status": f"invalid: exhaustive optimum step time {step} s"}
    return {"status": "ok", "step_s": step, "search_s": time.perf_counter() - t0,
            "ratio": step / plan["predicted"]["step_time_s"]}


# ---- output ---------------------------------------------------------------------------------------
def _fmt_t(s):
    return "-" if s is None else (f"{s:.3f}" if s >= 0.01 else f"{s * 1e3:.2f}ms")


def _cell(entry):
    if not entry:
        return "-"
    if entry.get("status") == "ok":
        sp = entry.get("speedup")
        return f"{_fmt_t(entry['step_s'])} ({sp:.2f}x)" if sp else _fmt_t(entry["step_s"])
    st = entry.get("status", "-")
    return "OOM" if st.startswith("OOM") else ("invalid" if st.startswith("invalid") else "n/a")


def to_markdown(rows, command, elapsed):
    out = [f"Command: `{command}`  ", f"Machine: {platform.machine()} {platform.system()}, Python {platform.python_version()}; "
           f"total {elapsed:.1f} s  ", "",
           "Step times are predicted seconds per training step.  Baseline cells: step time (speedup = baseline / sapp; "
           "> 1 means sapp's plan is faster).  Exhaustive cell: optimum step (sapp / optimum, 1.00 = optimal).", "",
           "| model | cluster | devices | batch | search s | sapp step s | samples/s | MFU | peak / capacity | dp.tp.pp | blocks/stage | schedule m | recompute | ZeRO | placement | DP | DP+ZeRO-3 | Megatron | exhaustive |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|---|---|---|---|---|"]
    for r in rows:
        s = r.get("sapp")
        ex = r.get("exhaustive") or {}
        ex_cell = (f"{_fmt_t(ex['step_s'])} ({1 / ex['ratio']:.2f})" if ex.get("status") == "ok" else
                   ("n/a" if ex else "-"))
        if s and r["status"] == "ok":
            mem = f"{s['peak_bytes'] / 1e9:.1f}/{r['capacity_bytes'] / 1e9:.0f} GB"
            sched = f"{s['schedule']}{'(v=' + str(s['v']) + ')' if (s.get('v') or 1) > 1 else ''} {s['m']}"
            out.append(f"| {r['model']} | {r['cluster']} | {r['devices']} | {r['global_batch']} | {r['search_s']:.2f} | "
                       f"{_fmt_t(s['step_s'])} | {s['throughput']:,.0f} | {100 * (s['mfu'] or 0):.1f}% | {mem} | "
                       f"{s['dp']}.{s['tp']}.{s['pp']} | {s.get('stage_blocks', '-')} | {sched} | {s['recompute']} | {s['zero']} | {s['placement']} | "
                       f"{_cell(r.get('dp'))} | {_cell(r.get('zero3'))} | {_cell(r.get('megatron'))} | {ex_cell} |")
        else:
            status = r["status"].split(":")[0] if r["status"].startswith(("OOM", "invalid")) else "error"
            out.append(f"| {r['model']} | {r['cluster']} | {r['devices']} | {r['global_batch']} | {r['search_s']:.2f} | "
                       f"{status} | - | - | - | - | - | - | - | - | - | {_cell(r.get('dp'))} | {_cell(r.get('zero3'))} | "
                       f"{_cell(r.get('megatron'))} | - |")
    out.append("")
    notes = [r for r in rows if r["status"] != "ok"]
    for r in notes:
        out.append(f"\n- {r['model']} on {r['devices']} x {r['cluster']}: {r['status']}")
    reasons = {}
    for r in rows:
        for b in BASELINES + ("exhaustive",):
            st = (r.get(b) or {}).get("status", "")
            if st.startswith(("n/a", "error", "invalid")):
                reasons.setdefault((b, st.partition(": ")[2][:160]), []).append(f"{r['model']}@{r['devices']}")
    for (b, why), where in sorted(reasons.items()):
        out.append(f"- {b} n/a ({', '.join(where)}): {why}")
    sp = {b: [r[b]["speedup"] for r in rows if (r.get(b, {}).get("speedup") or 0) > 0] for b in BASELINES}
    out.append("")
    for b, v in sp.items():
        oom = sum(1 for r in rows if r.get(b, {}).get("status", "").startswith("OOM"))
        if v:
            geo = 1.0
            for x in v:
                geo *= x
            geo **= 1 / len(v)
            out.append(f"- vs {b}: speedup geometric mean {geo:.2f}x over {len(v)} cases (min {min(v):.2f}x, "
                       f"max {max(v):.2f}x); {oom} case(s) where the baseline does not fit")
        else:
            out.append(f"- vs {b}: no comparable case; {oom} case(s) where the baseline does not fit")
    return "\n".join(out) + "\n"


CSV_COLS = ["model", "cluster", "devices", "global_batch", "status", "search_s", "step_s", "throughput", "mfu",
            "peak_bytes", "capacity_bytes", "dp", "tp", "pp", "stage_blocks", "schedule", "m", "v", "recompute", "zero", "placement"]


def to_csv(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLS + [f"{b}_{k}" for b in BASELINES for k in ("status", "step_s", "speedup")]
                   + ["exhaustive_step_s", "exhaustive_ratio"])
        for r in rows:
            s = r.get("sapp") or {}
            base = [r.get(k) if k in r else s.get(k) for k in CSV_COLS]
            extra = []
            for b in BASELINES:
                e = r.get(b) or {}
                extra += [e.get("status"), e.get("step_s"), e.get("speedup")]
            ex = r.get("exhaustive") or {}
            w.writerow(base + extra + [ex.get("step_s"), ex.get("ratio")])


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench", description="Model zoo x clusters x device counts: sapp vs baselines (predicted step times).")
    ap.add_argument("--quick", action="store_true", help="a few small cases (< 1 minute)")
    ap.add_argument("--out", default="bench/results", help="output folder (default bench/results)")
    ap.add_argument("--no-exhaustive", action="store_true", help="skip the exhaustive optimum")
    ap.add_argument("--only", help="comma-separated model names to run")
    args = ap.parse_args(argv)
    cases = QUICK_CASES if args.quick else FULL_CASES
    if args.only:
        keep = set(args.only.split(","))
        cases = [c for c in cases if c[0] in keep]
    os.makedirs(args.out, exist_ok=True)
    searcher = Searcher()
    rows, t0 = [], time.perf_counter()
    for model, batch, preset, devs in cases:
        for n in devs:
            r = run_case(searcher, model, batch, preset, n, exhaustive=not args.no_exhaustive)
            rows.append(r)
            s = r.get("sapp")
            print(f"{model:12} {preset:9} {n:5d}: " + (f"{s['step_s']:.4g} s dp={s['dp']} tp={s['tp']} pp={s['pp']} "
                  f"[{r['search_s']:.1f} s search]" if s else r["status"][:100])
                  + "  " + " ".join(f"{b}={_cell(r.get(b))}" for b in BASELINES), file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - t0
    command = "python -m bench" + (" --quick" if args.quick else "") + (f" --out {args.out}" if args.out != "bench/results" else "") \
        + (" --no-exhaustive" if args.no_exhaustive else "") + (f" --only {args.only}" if args.only else "")
    md = to_markdown(rows, command, elapsed)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"command": command, "elapsed_s": elapsed, "rows": rows}, f, indent=1, sort_keys=True)
    to_csv(rows, os.path.join(args.out, "results.csv"))
    print(md)
    return 0
