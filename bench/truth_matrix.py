"""Truth matrix: does each searched plan run exactly as it was priced?  `python -m bench.truth_matrix`

For the zoo's tiny models (gpt-tiny, bert-tiny, mlp-tiny, wide-deep-tiny) on the `cpu` preset, one
plan per {dp, tp, pp, dp x pp, dp x tp} x ZeRO 0-3 (where dp > 1) x recompute none / selective / full
(for models with blocks) x host placement (Wide&Deep's tables: device, host), each dimension pinned with
constraints.  Every plan runs in one spawned gloo job per world size (tests/emit_workers/truth_job.py);
per rank the table shows whether the emitter's manifest equals the plan's, and the measured memory
(sapp/emit/runtime/memory_meter.py: parameters + gradients + optimizer states + saved activations, incl. the
recompute and ZeRO-3 transients) against the plan's prediction for that rank's stage.

    python -m bench.truth_matrix [--models gpt-tiny,...] [--layouts dp,tp] [--json out.json]
                                 [--time-steps 3] [--cluster 2=cpu2.json,4=cpu4.json | --calibrate]

Time truth: after the metered step each plan runs `--time-steps` more steps, timed (wall, and each
rank's CPU time); per plan the slowest rank's median step is set against the plan's predicted step
time -- calibrated when the plans were searched on this machine's calibrated clusters (`--cluster`
files from `sapp calibrate --procs N`, or `--calibrate`), the `cpu` preset otherwise -- and the
summary gives Spearman's rank correlation over plans and the spread of the relative error, so a
pricing change that breaks time shows up like one that breaks memory.  On a shared machine the
absolute errors move with its load; the rank correlation is the sturdier figure.

Each rule the prediction rests on is measured on its own in tests/test_memory_rules.py (docs/ARCHITECTURE.md,
"Peak memory as torch holds it").  Fixed after the first full run (274/414 ranks within 10%), each a
statement of what torch does:
  - dropout: a CPU keeps the scaled noise at the input's width (fused CUDA dropout: a 1-byte mask).
  - recompute transient: at block j's backward the stashes after j are freed; selective re-saves only
    the attention core.
  - FSDP2 ZeRO-2: P/dp shards + the gathered P held from forward to backward; plain ZeRO-3 (root
    resharded after forward too): the root + one block gathered at that block's backward.
  - FSDP2 accumulating micro-batches: the whole unsharded G next to the activations where a forward
    follows a backward of the same step; the meter reads gradients in forwards and at the step.
  - host tables under ZeRO-2/3: FSDP2 ignores them, so a host placement also sheds their shard and
    gathered copy.
Left: host placements with tp > 1 (the saving is priced per tp shard while the stage may price the
tables whole); selective checkpointing also caches MUST_SAVE outputs no backward needs (the attention
module's output; inside 10%).
Device sparse tables (Wide&Deep's, pinned to the device): outside DDP/FSDP with SparseAdam and an
all-gather of touched rows (sapp/emit/host/sparse.py), priced whole at every ZeRO stage.
Emitter-side differences the manifest refuses: ZeRO >= 1 with the optimizer offloaded to the host
(OffloadAdam keeps the whole host state on every rank), ZeRO-3 + offload (not emitted).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("gpt-tiny", "bert-tiny", "mlp-tiny", "wide-deep-tiny")
LAYOUTS = {"dp": (2, 1, 1), "tp": (1, 2, 1), "pp": (1, 1, 2), "dpxpp": (2, 1, 2), "dpxtp": (2, 2, 1)}   # dp, tp, pp
RECOMPUTE = ("none", "selective", "full")
HOST = {"wide_emb.*": "host", "deep_emb.*": "host"}
DEVICE = {"wide_emb.*": "device", "deep_emb.*": "device"}
GLOBAL_BATCH = 8
TOL = 0.10


def case_list(models=MODELS, layouts=tuple(LAYOUTS), zeros=(0, 1, 2, 3), recomputes=RECOMPUTE) -> list:
    out = []
    for model in models:
        blocks = model != "wide-deep-tiny"          # Wide&Deep has no repeated blocks: no pp, no recompute
        for lay in layouts:
            dp, tp, pp = LAYOUTS[lay]
            if pp > 1 and not blocks:
                continue
            for zero in (zeros if dp > 1 else (0,)):
                for rc in (recomputes if blocks else ("none",)):
                    for host in ((False, True) if model == "wide-deep-tiny" and pp == 1 else (False,)):
                        cons = {"dp": dp, "tp": tp, "pp": pp, "zero": zero, "recompute": rc}
                        if model == "wide-deep-tiny":
                            cons["placement"] = dict(HOST if host else DEVICE)
                        else:
                            # the search weighs optimizer offload everywhere now; a case without
                            # "/host" checks the device-only program its id names
                            cons["placement"] = {"optimizer": "device"}
                        cid = f"{model}/{lay}/z{zero}/{rc}" + ("/host" if host else "")
                        out.append({"id": cid, "model": model, "world": dp * tp * pp, "constraints": cons})
    return out


def cluster_for(world, clusters=None):
    """The cluster a case of `world` ranks is searched on: a calibrated cluster file for that world size
    from `clusters` ({world: path}, e.g. written by `sapp calibrate --procs N`), else the `cpu` preset."""
    import sapp
    path = (clusters or {}).get(world)
    return sapp.Cluster.parse(path) if path else sapp.Cluster.parse(f"cpu:gpus={world}")


def search_plans(cases, tmp, clusters=None) -> list:
    """Search each case's plan on cpu:gpus=WORLD, or on clusters[WORLD] (a calibrated cluster file);
    refusals recorded, not raised."""
    import sapp
    import sapp.models as models
    from sapp.api import search
    from sapp.errors import SappError
    for c in cases:
        t0 = time.perf_counter()
        try:
            plan = search(models.get(c["model"], device="meta", **c.get("model_args", {})),
                          cluster_for(c["world"], clusters),
                          global_batch=GLOBAL_BATCH, constraints=c["constraints"])
            path = os.path.join(tmp, c["id"].replace("/", "_") + ".json")
            plan.save(path)
            c["plan_path"] = path
            c["config"] = {"m": plan.pipeline.get("micro_batches"), "schedule": plan.pipeline.get("schedule"),
                           "placement": sorted((plan.placement or {}).get("groups") or {})}
            c["predicted_step_s"] = float(plan.predicted["step_time_s"])
        except SappError as e:
            c["refused"] = f"{type(e).__name__}: {e}"
        c["search_s"] = time.perf_counter() - t0
    return cases


def run_jobs(cases, tmp, timeout=900, steps=2, time_steps=0) -> dict:
    """One truth_job subprocess per world size; returns {case id: {rank: record}}."""
    out = {}
    for world in sorted({c["world"] for c in cases if "plan_path" in c}):
        mine = [{"id": c["id"], "model": c["model"], "model_args": c.get("model_args", {}), "plan_path": c["plan_path"],
                 "steps": steps, "time_steps": time_steps}
                for c in cases if c["world"] == world and "plan_path" in c]
        cpath, opath = os.path.join(tmp, f"cases{world}.json"), os.path.join(tmp, f"out{world}.json")
        with open(cpath, "w") as f:
            json.dump(mine, f)
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.run([sys.executable, "-m", "tests.emit_workers.truth_job", str(world), cpath, opath],
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        if not os.path.exists(opath):
            raise RuntimeError(f"truth job for {world} ranks wrote nothing: {proc.stderr[-2000:]}")
        with open(opath) as f:
            res = json.load(f)
        if res["job_errors"]:
            raise RuntimeError(f"truth job for {world} ranks failed: {list(res['job_errors'].values())[0][-2000:]}")
        out.update(res["cases"])
    return out


def reference_losses(model: str, model_args: dict, steps: int = 2) -> list:
    """Single-process full-batch training of the same model and data (what every plan must match)."""
    import torch
    import sapp.models as models
    torch.manual_seed(0)
    m = models.get(model, device="cpu", **model_args)
    x, y = models.example_inputs(m, GLOBAL_BATCH, "cpu"), models.example_targets(m, GLOBAL_BATCH, "cpu")
    x = x if isinstance(x, tuple) else (x,)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    loss_fn, out = models.loss_fn(m), []
    for _ in range(steps):
        loss = loss_fn(m(*x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def _total(mem: dict) -> float:
    return sum(v for k, v in mem.items() if k not in ("total", "buffers"))


def rows(cases, results) -> list:
    """One row per (case, rank): manifest match, measured vs predicted memory."""
    out = []
    for c in cases:
        if "refused" in c:
            out.append({"id": c["id"], "rank": None, "refused": c["refused"]})
            continue
        for rank, r in sorted((results.get(c["id"]) or {}).items(), key=lambda kv: int(kv[0])):
            if r is None or "error" in r:
                out.append({"id": c["id"], "rank": int(rank), "error": (r or {}).get("error", "no result")})
                continue
            meas, pred = r["measured"], r["predicted"]
            mt, pt = meas["total"], _total(pred)
            out.append({"id": c["id"], "rank": int(rank), "stage": r["stage"], "config": c.get("config"),
                        "manifest_ok": not r["mismatches"] and r["manifest"] == r["expected"],
                        "diff": [k for k in r["expected"] if r["expected"][k] != r["manifest"].get(k)],
                        "measured": meas, "predicted": pred, "measured_total": mt, "predicted_total": pt,
                        "error": None, "rel_err": (mt - pt) / pt if pt else float("nan"), "losses": r["losses"],
                        "unpriced_recompute": r.get("unpriced_recompute"),
                        "step_s": r.get("step_s") or [], "cpu_s": r.get("cpu_s") or [],
                        "predicted_step_s": c.get("predicted_step_s")})
    return out


def _mb(x):
    return f"{x / 2**20:7.3f}"


def table(rs) -> str:
    lines = [f"{'plan':38s} {'rank':>4s} {'manifest':>8s} {'measured MiB':>12s} {'predicted':>9s} {'err':>7s}   "
             f"components measured/predicted (params grads optim act+transient)"]
    for r in rs:
        if r.get("refused"):
            lines.append(f"{r['id']:38s} {'-':>4s}  search refused: {r['refused'][:90]}")
            continue
        if r.get("error"):
            lines.append(f"{r['id']:38s} {r['rank']:>4d}  ERROR: {r['error'][:100]}")
            continue
        m, p = r["measured"], r["predicted"]
        act_m = m["activations"] + m["transient"]
        act_p = p.get("activations", 0) + p.get("transient", 0)
        comp = " ".join(f"{_mb(a).strip()}/{_mb(b).strip()}" for a, b in (
            (m["params"], p.get("params", 0)), (m["grads"], p.get("grads", 0)), (m["optimizer"], p.get("optimizer", 0)),
            (act_m, act_p)))
        extra = f" host {_mb(p['host_offload']).strip()}" if p.get("host_offload") else ""
        lines.append(f"{r['id']:38s} {r['rank']:>4d} {'ok' if r['manifest_ok'] else 'DIFF':>8s} "
                     f"{_mb(r['measured_total']):>12s} {_mb(r['predicted_total']):>9s} {r['rel_err'] * 100:6.1f}%   "
                     f"{comp}{extra}" + ("" if r["manifest_ok"] else f"  diff: {r['diff']}"))
    return "\n".join(lines)


def summary(rs) -> str:
    ok = [r for r in rs if not r.get("refused") and not r.get("error")]
    errs = sorted(abs(r["rel_err"]) for r in ok)
    plans = {r["id"] for r in rs if not r.get("refused")}
    s = (f"{len(plans)} plans run ({sum(1 for r in rs if r.get('refused'))} refused by the search), {len(ok)} ranks; "
         f"manifest == plan on {sum(r['manifest_ok'] for r in ok)}/{len(ok)} ranks; errors: "
         f"{sum(1 for r in rs if r.get('error'))}")
    if errs:
        s += (f"\nmemory |measured - predicted| / predicted: median {statistics.median(errs) * 100:.1f}%, "
              f"worst {errs[-1] * 100:.1f}%, within {TOL:.0%}: {sum(e <= TOL for e in errs)}/{len(errs)}")
    return s


def families(rs) -> str:
    """Markdown table: error per configuration family (model, layout, ZeRO stage, recompute)."""
    ok = [r for r in rs if not r.get("refused") and not r.get("error")]
    groups = {}
    for r in ok:
        model, lay, z, rc = r["id"].split("/")[:4]
        for key in (f"model {model}", f"layout {lay}", f"ZeRO-{z[1:]}", f"recompute {rc}"):
            groups.setdefault(key, []).append(abs(r["rel_err"]))
    lines = ["| family | ranks | median error | worst | within 10% |", "|---|---|---|---|---|"]
    for key in sorted(groups, key=lambda k: (k.split()[0], k)):
        e = sorted(groups[key])
        lines.append(f"| {key} | {len(e)} | {statistics.median(e) * 100:.1f}% | {e[-1] * 100:.1f}% | "
                     f"{sum(x <= TOL for x in e)}/{len(e)} |")
    return "\n".join(lines)


def measure(cases=None) -> list:
    """Search every case's plan, run them all, and return the per-rank rows (default: the full matrix)."""
    cases = case_list() if cases is None else cases
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        search_plans(cases, tmp, {})
        t1 = time.perf_counter()
        results = run_jobs(cases, tmp)
    print(f"search {t1 - t0:.0f} s, runs {time.perf_counter() - t1:.0f} s", file=sys.stderr)
    return rows(cases, results)


def _ranks(xs) -> list:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):           # ties share their mean rank
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2
        i = j + 1
    return r


def spearman(xs, ys) -> float:
    """Spearman's rank correlation (Pearson's over ranks, ties averaged); nan under 3 points."""
    if len(xs) < 3:
        return float("nan")
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx and vy else float("nan")


def time_rows(rs) -> list:
    """One row per plan: the median measured step (wall; the slowest rank's median, as steps end
    together in the loss all-reduce) and CPU time against the plan's predicted step time."""
    by = {}
    for r in rs:
        if r.get("refused") or r.get("error") or not r.get("step_s"):
            continue
        by.setdefault(r["id"], []).append(r)
    out = []
    for cid, ranks in by.items():
        meas = max(statistics.median(r["step_s"]) for r in ranks)
        cpu = max(statistics.median(r["cpu_s"]) for r in ranks)
        pred = ranks[0]["predicted_step_s"]
        out.append({"id": cid, "measured_s": meas, "cpu_s": cpu, "predicted_s": pred,
                    "rel_err": (meas - pred) / pred if pred else float("nan")})
    return out


def time_summary(ts, calibrated: bool) -> str:
    if not ts:
        return "step time: not measured (--time-steps 0)"
    errs = sorted(t["rel_err"] for t in ts)
    q = lambda f: errs[min(len(errs) - 1, int(f * (len(errs) - 1) + 0.5))]
    rho = spearman([t["predicted_s"] for t in ts], [t["measured_s"] for t in ts])
    return (f"step time vs {'calibrated' if calibrated else 'cpu-preset (uncalibrated)'} prediction over {len(ts)} plans: "
            f"Spearman {rho:.3f}; (measured - predicted) / predicted median {statistics.median(errs) * 100:+.1f}%, "
            f"p10 {q(0.1) * 100:+.1f}%, p90 {q(0.9) * 100:+.1f}%, median |err| "
            f"{statistics.median(abs(e) for e in errs) * 100:.1f}%, within 25%: {sum(abs(e) <= 0.25 for e in errs)}/{len(errs)}")


def time_table(ts) -> str:
    lines = [f"{'plan':38s} {'measured ms':>11s} {'CPU ms':>8s} {'predicted ms':>12s} {'err':>7s}"]
    for t in sorted(ts, key=lambda t: t["id"]):
        lines.append(f"{t['id']:38s} {t['measured_s'] * 1e3:>11.1f} {t['cpu_s'] * 1e3:>8.1f} "
                     f"{t['predicted_s'] * 1e3:>12.1f} {t['rel_err'] * 100:>6.1f}%")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="bench.truth_matrix")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--zeros", default="0,1,2,3")
    ap.add_argument("--recompute", default=",".join(RECOMPUTE))
    ap.add_argument("--json")
    ap.add_argument("--time-steps", type=int, default=3, help="unmetered steps timed per plan (0: no time truth)")
    ap.add_argument("--cluster", default="", help="calibrated cluster files per world size, e.g. "
                    "2=cpu2.json,4=cpu4.json (default: the cpu preset, uncalibrated)")
    ap.add_argument("--calibrate", action="store_true", help="calibrate this machine for 2 and 4 processes first "
                    "(sapp.calibrate, quick) and search on those clusters")
    a = ap.parse_args(argv)
    cases = case_list(a.models.split(","), a.layouts.split(","), tuple(int(z) for z in a.zeros.split(",")),
                      tuple(a.recompute.split(",")))
    t0 = time.perf_counter()
    clusters = {int(k): v for k, v in (x.split("=", 1) for x in a.cluster.split(",") if x)}
    with tempfile.TemporaryDirectory() as tmp:
        if a.calibrate:
            from sapp.calibrate import calibrate
            for w in sorted({c["world"] for c in cases}):
                cl, _ = calibrate(procs=w, quick=True, timeout_s=240, name=f"cpu{w}-calibrated")
                clusters[w] = os.path.join(tmp, f"cluster-cpu{w}.json")
                cl.save(clusters[w])
        search_plans(cases, tmp, clusters)
        t1 = time.perf_counter()
        results = run_jobs(cases, tmp, time_steps=a.time_steps)
    rs = rows(cases, results)
    ts = time_rows(rs)
    print(table(rs))
    print(summary(rs))
    print(families(rs))
    if ts:
        print(time_table(ts))
    print(time_summary(ts, calibrated=bool(clusters)))
    print(f"search {t1 - t0:.0f} s, runs {time.perf_counter() - t1:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cases": cases, "rows": rs, "time": ts}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
