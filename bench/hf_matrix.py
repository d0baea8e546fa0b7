"""Issue #13's emission matrix: 8 Hugging Face architectures (tiny configs: 2 layers, hidden 64,
seq 16) x 5 parallel configurations, each from sapp's own search with the degrees pinned, each
trained 3 Adam steps on gloo and compared with single-process training of the same model.

    python -m bench.hf_matrix [--models llama,bert] [--configs dp2,tp2] [--steps 3] [--timeout 400]

One spawned job per (model, process count) runs that model's configurations in the same processes;
a job that hangs is killed at --timeout and its cases reported as such.  Prints a table: per case
pass/fail, max relative loss error, search and run wall time, and the reason of a failure.

bench/RESULTS.md §5's float64 rows (2026-11-29, 3 Adam steps): BERT tp2 and DistilBERT tp2 (tied table
split by vocabulary) 0 (bit-equal); BERT pp2 x tp2 2e-16; BERT dp2 x tp2, ZeRO-1 and ZeRO-3 1.6e-16;
Qwen2 and Llama dp2 x tp2, ZeRO-1 4e-16."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
TOL = 1e-5


def _one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:160]


def run_matrix(models, configs, steps=3, timeout=400.0, log=print) -> list:
    from tests.emit_workers import hf_plans
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in models:
            by_world = {}
            for cfg in configs:
                row = {"model": kind, "config": cfg, "ok": False, "err": None, "search_s": None, "run_s": None,
                       "reason": ""}
                rows.append(row)
                t0 = time.perf_counter()
                try:
                    path = hf_plans.search_plan(kind, cfg, os.path.join(tmp, f"{kind}-{cfg}.json"))
                except Exception as e:        # capture / search failure: the case fails with its reason
                    row["reason"] = "search: " + _one_line(e)
                    continue
                row["search_s"] = time.perf_counter() - t0
                row["plan"] = path
                by_world.setdefault(hf_plans.world(cfg), []).append(row)
            for world, wrows in sorted(by_world.items()):
                cases = [{"id": r["config"], "kind": kind, "plan_path": r["plan"], "steps": steps,
                          "batch": hf_plans.BATCH} for r in wrows]
                _run_job(world, cases, wrows, tmp, timeout)
            for r in (x for x in rows if x["model"] == kind):
                log(_fmt_row(r))
    return rows


def _run_job(world, cases, wrows, tmp, timeout):
    cpath, opath = os.path.join(tmp, "cases.json"), os.path.join(tmp, "out.json")
    if os.path.exists(opath):
        os.remove(opath)
    with open(cpath, "w") as f:
        json.dump(cases, f)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        proc = subprocess.run([sys.executable, "-m", "tests.emit_workers.hf_harness", str(world), cpath, opath],
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        tail = proc.stderr.strip().splitlines()[-1:] if proc.returncode else []
    except subprocess.TimeoutExpired:
        for r in wrows:
            r["reason"] = f"run: job timed out after {timeout:.0f} s"
        return
    if not os.path.exists(opath):
        for r in wrows:
            r["reason"] = "run: " + (tail[0] if tail else "no result")
        return
    with open(opath) as f:
        out = json.load(f)
    job_err = next(iter(out["errors"].values()), "") if out["errors"] else ""
    job_err = job_err.strip().splitlines()[-1] if job_err else ""
    for r in wrows:
        res = out["cases"].get(r["config"]) or {}
        ref, ranks = res.get("ref"), res.get("ranks") or {}
        got = [ranks.get(str(i)) for i in range(world)]
        if any(g is None for g in got):
            r["reason"] = "run: " + (job_err or "a rank reported nothing")[:160]
            continue
        errs = [g["error"] for g in got if "error" in g]
        if errs:
            r["reason"] = "emit: " + errs[0][:160]
            continue
        rel = max(abs(a - b) / abs(b) for g in got for a, b in zip(g["losses"], ref))
        r["err"] = rel
        r["run_s"] = max(g["wall_s"] for g in got)
        r["ok"] = rel <= TOL and len(got[0]["losses"]) == len(ref)
        r["notes"] = got[0].get("notes") or []
        if not r["ok"]:
            r["reason"] = f"losses differ from single-process training (max rel {rel:.2e})"


def _fmt_row(r) -> str:
    err = f"{r['err']:.1e}" if r["err"] is not None else "-"
    s = f"{r['search_s']:.1f}" if r["search_s"] is not None else "-"
    t = f"{r['run_s']:.1f}" if r["run_s"] is not None else "-"
    return (f"| {r['model']:<8} | {r['config']:<8} | {'pass' if r['ok'] else 'FAIL':<4} | {err:>7} | {s:>6} | {t:>6} | "
            f"{r['reason']} |")


HEADER = ("| model    | config   | ok   | max rel | search s | run s | reason |\n"
          "|---|---|---|---|---|---|---|")


def main(argv=None) -> int:
    from tests.emit_workers import hf_models, hf_plans
    p = argparse.ArgumentParser(prog="python -m bench.hf_matrix")
    p.add_argument("--models", default=",".join(hf_models.KINDS))
    p.add_argument("--configs", default=",".join(hf_plans.CONFIGS))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--timeout", type=float, default=400.0)
    p.add_argument("--json", help="also write the rows here")
    a = p.parse_args(argv)
    print(HEADER, flush=True)
    t0 = time.perf_counter()
    rows = run_matrix(a.models.split(","), a.configs.split(","), a.steps, a.timeout,
                      log=lambda s: print(s, flush=True))
    n_ok = sum(r["ok"] for r in rows)
    print(f"\n{n_ok} of {len(rows)} cases match single-process training within {TOL:g} relative "
          f"({time.perf_counter() - t0:.0f} s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if n_ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
