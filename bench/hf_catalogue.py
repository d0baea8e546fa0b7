"""Issue #26's catalogue: every architecture of transformers' auto mappings (causal LM, masked LM, seq2seq
LM, image classification) built tiny from its shrunk default config (tests/emit_workers/hf_catalogue_models.py),
then, per architecture:

  cheap   capture with its loss, the unknown ops, a free search (cpu, 2 devices), and whether a pinned
          tp=2 search on a cluster where tp pays (links free, compute slow: tests/emit_workers/hf_plans.py)
          shards any module;
  dp2 / pp2 / tp2 / tp2+sp
          sapp's own plan for that layout trained 3 Adam steps on 2 gloo ranks vs one process (relative
          1e-5, tests/emit_workers/hf_harness.py).

    python -m bench.hf_catalogue [--out FILE.jsonl] [--shard i/n] [--columns cheap,dp2,pp2,tp2,tp2+sp]
                                 [--only a,b] [--timeout 300] [--workers 1]
    python -m bench.hf_catalogue --report [--out FILE.jsonl]

One long-lived parent (torch, transformers and sapp imported once) forks one child per (architecture,
column) from a pool of --workers slots; an emission child forks its 2 gloo ranks.  A child past
--timeout is killed with its ranks (its own process group).  Each result is one JSONL line: a rerun
skips what is done (resumable), --shard i/n takes every n-th architecture.  All cheap cases run before
any emission case.  Every failure carries a named class (`classify`) and a one-line reason; --report
prints each column's share and every class with its count.

Refusals (bench/RESULTS.md §11):
- Every other row is refused before the first step, in one line:
  - pp2: albert, hrm_text (too few blocks); xlm, flaubert (data-dependent output in stage 0); longt5,
    longformer, led, fsmt (a forward branching on values or a mask built outside export).
  - tp2: bigbird_pegasus, prophetnet (the shape audit); big_bird (a module rebuilt in forward) and
    t5gemma2 (an embedding writing into its looked-up rows: kept replicated) run tp2 equal since
    (`--only big_bird,t5gemma2 --columns tp2`, 2026-12-03).
  - tp2+SP (2026-11-26): bigbird_pegasus, prophetnet, big_bird, t5gemma2, and encoder-decoder (an SP entry
    holding a stack of blocks).
- Capture refuses in one line: ibert (QuantAct's `.data.min()`), jetmoe (routing sizes are unbacked
  symbols), switch_transformers (a module reassigned in forward).

`--columns cheap` over all 295 types (bench/RESULTS.md §11, 2026-11-26): 246 build tiny offline, 243
capture (98.8%), 243 with 0 unknown ops, 243 search, 239 shard something under pinned tp2."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import signal
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
TOL = 1e-5
# the float64 re-run's bar: a correct layout agrees with one process there to <= 3e-12 after 3 Adam
# steps (measured: the BatchNorm rows 4e-2 off in float32 -- MobileNet v1/v2, MobileViT, EfficientNet
# under dp2/pp2/tp2 -- and a conv+BN net of ours at 4e-16), while a float32 step anywhere in a float64
# run (the offload masters were fp32) already shows as 2.7e-8
TOL_F64 = 1e-9
F64 = "differ"          # "differ": only rows over TOL re-run in float64; "all": every row, judged by it
EMIT = ("dp2", "pp2", "tp2", "tp2+sp")
COLUMNS = ("cheap",) + EMIT
DEFAULT_OUT = os.path.join(ROOT, "bench", "hf_catalogue.jsonl")
STEPS, BATCH = 3, 8
# where the cases come from: a module with catalogue(), build(), batch(), skip_reason() and the kind
# prefix tests/emit_workers/hf_models.py hands to it (bench/lib_catalogue.py points both elsewhere)
MODELS, PREFIX = "tests.emit_workers.hf_catalogue_models", "cat:"


def _models():
    return importlib.import_module(MODELS)


def _line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:200]


from bench.catalogue_classes import CLASSES, classify, failure  # noqa: E402,F401  (the catalogues' names)


# ---- the cases (run in a forked child) ------------------------------------------------------------
def case_cheap(arch: str, tmp: str, free: bool = True) -> dict:
    """Build, capture, unknown ops, the free search (unless `free` is False) and the pinned tp2 search."""
    from sapp.api import capture_graph, search
    from tests.emit_workers import hf_plans
    C = _models()
    kind = PREFIX + arch
    row = dict(zip(getattr(C, "ROW_KEYS", ("task", "class")), C.catalogue()[arch]))
    t = time.process_time()
    try:
        why = C.skip_reason(kind)
        if why:
            return dict(row, ok=False, phase="build", reason=why, buildable=False)
        model, loss_fn = C.build(kind, device="meta")
        x, y = C.batch(kind, BATCH, 0)
    except Exception as e:                     # noqa: BLE001 - classified, one line
        return dict(row, ok=False, phase="build", reason=_line(e), buildable=False)
    row.update(buildable=True, params=sum(p.numel() for p in model.parameters()))
    try:
        graph, _ = capture_graph(model, x, loss_fn, y)
    except Exception as e:                     # noqa: BLE001
        why = _eager_fails(kind)
        if why:                               # the tiny model itself does not run: not sapp's failure
            return dict(row, ok=False, phase="build", reason="eager forward fails: " + why, buildable=False)
        if "real parameters and example inputs" not in str(e):
            return dict(row, ok=False, phase="capture", reason=_line(e), capture=False)
        try:                                  # a branch on tensor values: capture takes it with real values
            model, loss_fn = C.build(kind)
            graph, _ = capture_graph(model, x, loss_fn, y)
            row.update(capture_real=True)
        except Exception as e2:               # noqa: BLE001
            return dict(row, ok=False, phase="capture", reason=_line(e2), capture=False)
    unk = graph.meta.get("unknown_ops") or []
    row.update(capture=True, nodes=len(graph.nodes), capture_cpu_s=round(time.process_time() - t, 2),
               unknown=[{"op": r["op"], "count": r["count"], "module": (r["modules"] or [""])[0]} for r in unk])
    try:
        if free:
            plan = search(model, "cpu:gpus=2", global_batch=BATCH, example_inputs=x, loss_fn=loss_fn, targets=y,
                          graph=graph)
            row.update(free_parallel=plan.parallel)
        row.update(search=True)
    except Exception as e:                     # noqa: BLE001
        row.update(search=False, search_reason=_line(e))
    try:
        plan = search(model, hf_plans.TP_CLUSTER.format(n=2), global_batch=BATCH, example_inputs=x,
                      loss_fn=loss_fn, targets=y, graph=graph, constraints={"dp": 1, "tp": 2, "pp": 1, "zero": 0})
        path = os.path.join(tmp, "tp2.json")
        plan.save(path)
        with open(path) as f:
            row.update(tp2_modules=len(json.load(f).get("tp_modules") or {}))
    except Exception as e:                     # noqa: BLE001
        row.update(tp2_modules=None, tp2_reason=_line(e))
    row["cpu_s"] = round(time.process_time() - t, 2)
    fails = ([f"unknown: {', '.join(sorted(u['op'] for u in row['unknown']))}"] if row["unknown"] else []) + \
        ([f"search: {row['search_reason']}"] if not row["search"] else []) + \
        ([f"tp2: {row['tp2_reason']}"] if row["tp2_modules"] is None else
         ["tp2: shards nothing"] if not row["tp2_modules"] else [])
    return dict(row, ok=not fails, phase="cheap", reason="; ".join(fails))


def _eager_fails(kind) -> str | None:
    """One line when the tiny model's own forward + loss fails on CPU (None: it runs)."""
    C = _models()
    try:
        model, loss_fn = C.build(kind)
        x, y = C.batch(kind, 2, 0)
        loss_fn(model(*x), y)
    except Exception as e:                     # noqa: BLE001
        return _line(e)
    return None


def case_emit(arch: str, config: str, tmp: str) -> dict:
    from tests.emit_workers import hf_harness, hf_plans
    kind = PREFIX + arch
    t0 = time.perf_counter()
    try:
        path = hf_plans.search_plan(kind, config, os.path.join(tmp, f"{config}.json"))
    except Exception as e:                     # noqa: BLE001
        return {"ok": False, "phase": "search", "reason": _line(e)}
    with open(path) as f:
        plan = json.load(f)
    row = {"tp_modules": len(plan.get("tp_modules") or {}), "parallel": plan.get("parallel")}
    case = {"id": config, "kind": kind, "plan_path": path, "steps": STEPS, "batch": BATCH}
    out = hf_harness.run(2, [case])
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    failed, rel, got, res = _judge_run(out, config)
    if failed:
        return dict(row, **failed)
    ok = rel <= TOL
    if not ok or F64 == "all":
        # the float64 re-run judges: rounding chaos (BatchNorm nets, where one process with the batch
        # summed in another order moves step 2 by 4e-2) shrinks ~1e9x, a real difference does not
        row["rel_f32"] = rel
        failed64, rel64, got64, res64 = _judge_run(hf_harness.run(2, [dict(case, dtype="float64")]), config)
        if failed64 and ok:                   # recorded: the float32 verdict stands
            row["f64_error"] = failed64["reason"]
        elif failed64:
            return dict(row, ok=False, rel=rel, phase="compare",
                        reason=f"losses differ from one process (max rel {rel:.2e}); the float64 re-run failed: "
                               f"{failed64['reason']}"[:200])
        else:                                 # the float64 run judges (with --f64 all, a row
            row["rel_f64"] = rel64            # within the float32 bar too)
            ok, rel, got, res = rel64 <= TOL_F64, rel64, got64, res64
            if not ok:
                return dict(row, ok=False, rel=rel, phase="compare",
                            reason=f"losses differ from one process in float64 (max rel {rel64:.2e}; float32 "
                                   f"{row['rel_f32']:.2e}) with no error")
    drift = replica_drift(got) if int((row["parallel"] or {}).get("pp", 1) or 1) == 1 else None
    if ok and drift:
        return dict(row, ok=False, rel=rel, phase="compare",
                    reason=f"replicated parameter {drift[0]} differs between ranks (rel {drift[1]:.2e}) with no error")
    # recorded, not judged: Adam steps a weight whose true gradient is 0 (a key bias under softmax's
    # shift invariance: Funnel, BERT) by lr-sized moves on rounding noise, so one process against
    # itself differs there as much as a wrong gradient would show (Funnel's k_head.bias: 4e-3..9e-2)
    off = reference_drift(got, res.get("ref_params") or {})
    if off:
        row["weights_off"] = [off[0], off[1]]
    return dict(row, ok=ok, rel=rel, phase="compare",
                reason="" if ok else f"losses differ from one process (max rel {rel:.2e}) with no error")


def _judge_run(out: dict, config: str):
    """(failure row part or None, max relative loss difference, the ranks' results, the case) of one
    harness run."""
    res = out["cases"][config]
    ref, got = res["ref"], [res["ranks"].get(str(r)) for r in range(2)]
    if any(g is None for g in got):
        err = next(iter(out["errors"].values()), "") or out.get("failed") or "a rank reported nothing"
        return {"ok": False, "phase": "rank", "reason": err.strip().splitlines()[-1][:200]}, None, got, res
    # the rank whose own code raised, not one that lost its peer in a collective
    errs = sorted((g for g in got if "error" in g), key=lambda g: bool(re.search(_PEER_LOST, g["error"])))
    if errs:
        return {"ok": False, "phase": errs[0].get("phase", "emit"), "reason": errs[0]["error"][:200]}, None, got, res
    if len(got[0]["losses"]) != len(ref):
        return {"ok": False, "phase": "compare", "reason": f"{len(got[0]['losses'])} losses for {len(ref)} steps"}, \
            None, got, res
    return None, max(abs(a - b) / abs(b) for g in got for a, b in zip(g["losses"], ref)), got, res


def replica_drift(got: list, tol: float = 1e-6):
    """(name, relative difference) of the first parameter two ranks both hold whole but with different
    values, or None.  A replicated weight must stay the same on every rank; one stepped with a
    rank-local partial gradient drifts while the losses can still agree for a few steps."""
    a, b = (g.get("replicas") or {} for g in got[:2])
    for name in sorted(set(a) & set(b)):
        for x, y in zip(a[name], b[name]):
            d = abs(x - y) / max(abs(x), abs(y), 1e-12)
            if d > tol:
                return name, d
    return None


def reference_drift(got: list, ref: dict, tol: float = 1e-5):
    """(name, relative difference) of the first parameter a rank holds whole whose sum of squares after
    training differs from one process's by more than `tol`, or None: a diagnostic column.  A wrong
    gradient (a cut path in a pipeline stage) moves the weights before the losses show it (Llama pp2
    stays within 1.3e-7; dots3_note_text's cut gradient was 8e-5 after one step), but so does Adam on a
    weight with no true gradient, so rows record it and the losses judge.  Stage modules keep the
    model's dotted names, maybe under a prefix (`module.` for DDP)."""
    for g in got:
        for name, (_, sq) in sorted((g.get("replicas") or {}).items()):
            mine = [k for k in ref if k == name or name.endswith("." + k)]
            if len(mine) != 1:
                continue
            rsq = ref[mine[0]][1]
            d = abs(sq - rsq) / max(abs(rsq), 1e-12)
            if d > tol:
                return name, d
    return None


_PEER_LOST = r"Connection closed by peer|Connection reset|remote worker crash|another rank"


def _child(arch, column, conn):
    import tempfile
    os.setsid()                               # its gloo ranks die with it on a timeout
    try:
        with tempfile.TemporaryDirectory() as tmp:
            r = case_cheap(arch, tmp) if column == "cheap" else case_emit(arch, column, tmp)
    except BaseException as e:                # noqa: BLE001 - the child reports, never raises
        r = {"ok": False, "phase": "harness", "reason": _line(e)}
    conn.send(r)
    conn.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---- the pool -------------------------------------------------------------------------------------
def load(out: str) -> list:
    if not os.path.exists(out):
        return []
    rows = []
    with open(out) as f:
        for ln in f:
            try:
                rows.append(json.loads(ln))
            except ValueError:                # a line cut by a kill: that case runs again
                pass
    return rows


def run(archs, columns, out, timeout=300.0, workers=1, log=print):
    import multiprocessing as mp
    rows = load(out)
    done = {(r["arch"], r["column"]) for r in rows}
    cheap = {r["arch"]: r for r in rows if r["column"] == "cheap"}
    todo = [(a, "cheap") for a in archs if "cheap" in columns and (a, "cheap") not in done]
    todo += [(a, c) for a in archs for c in EMIT if c in columns and (a, c) not in done]
    ctx = mp.get_context("fork")
    running = {}                              # pid -> (proc, conn, arch, column, t0)
    # a case's clock counts only the time this loop ran: a stopped catalogue (kill -STOP while the
    # suite runs, a suspended machine) stops its cases too, and must not time them out at -CONT
    active, last = {}, time.monotonic()
    while todo or running:
        while todo and len(running) < workers:
            arch, col = todo[0]
            if col != "cheap":
                if any(v[3] == "cheap" for v in running.values()):
                    break                     # emission starts once every cheap case is in
                c = cheap.get(arch)
                if c is not None and not c.get("capture"):
                    todo.pop(0)               # not buildable or not captured: the column is not attempted
                    continue
            todo.pop(0)
            rcv, snd = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, args=(arch, col, snd))
            p.start()
            snd.close()
            running[p.pid] = (p, rcv, arch, col, time.time())
        time.sleep(0.2)
        now = time.monotonic()
        gap, last = min(now - last, 5.0), now
        for pid in running:
            active[pid] = active.get(pid, 0.0) + gap
        for pid, (p, rcv, arch, col, t0) in list(running.items()):
            res = None
            if rcv.poll():
                try:
                    res = rcv.recv()
                except EOFError:
                    res = {"ok": False, "phase": "harness", "reason": "the case's process died without a result"}
            elif not p.is_alive():
                res = {"ok": False, "phase": "harness", "reason": f"the case's process died (exit {p.exitcode})"}
            elif active[pid] > timeout:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                res = {"ok": False, "phase": col, "reason": f"timed out after {timeout:.0f} s"}
            if res is None:
                continue
            p.join(5)
            del running[pid]
            res.update(arch=arch, column=col, wall_s=round(time.time() - t0, 1), active_s=round(active.pop(pid), 1))
            if not res["ok"]:
                res["failure"] = failure(res)
            if col == "cheap":
                cheap[arch] = res
            with open(out, "a") as f:
                f.write(json.dumps(res, sort_keys=True) + "\n")
            log(f"{arch:<28} {col:<7} {'ok' if res['ok'] else 'FAIL':<4} {res['wall_s']:>6.1f}s "
                f"{res.get('failure', '')}: {res.get('reason', '')}"[:220])


# ---- the report -----------------------------------------------------------------------------------
def report(rows, attempted: int | None = None) -> str:
    """Each column's share and every failure class with its count (the last row of a case wins)."""
    last = {}
    for r in rows:
        last[(r["arch"], r["column"])] = r
    cheap = [r for (a, c), r in sorted(last.items()) if c == "cheap"]
    built = [r for r in cheap if r.get("buildable")]
    cap = [r for r in built if r.get("capture")]
    lines = [f"architectures in the four mappings: {attempted if attempted is not None else '?'}; "
             f"cheap column run on {len(cheap)}; buildable tiny offline: {len(built)}", "",
             "| column | passed | of | share |", "|---|---|---|---|"]

    def share(name, ok, of):
        lines.append(f"| {name} | {ok} | {of} | {100 * ok / of:.0f}% |" if of else f"| {name} | 0 | 0 | - |")
    share("builds tiny offline", len(built), len(cheap))
    share("captures", len(cap), len(built))
    share("0 unknown ops", sum(1 for r in cap if not r.get("unknown")), len(built))
    share("free search", sum(1 for r in cap if r.get("search")), len(built))
    share("pinned tp2 shards something", sum(1 for r in cap if r.get("tp2_modules")), len(built))
    silent = 0
    for col in EMIT:
        rs = [r for (a, c), r in sorted(last.items()) if c == col]
        silent += sum(1 for r in rs if r.get("phase") == "compare" and not r["ok"])
        share(f"{col} equals one process (of run)", sum(1 for r in rs if r["ok"]), len(rs))
    lines += ["", f"silently wrong runs (losses differ, no error): {silent}", "",
              "| column | failure class | count | e.g. |", "|---|---|---|---|"]
    for col in COLUMNS:
        rs = [r for (a, c), r in sorted(last.items()) if c == col and not r["ok"]]
        by = {}
        for r in rs:
            for k in failure(r).split("; "):
                by.setdefault(k, []).append(r)
        for k, v in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            eg = v[0]
            lines.append(f"| {col} | {k} | {len(v)} | {eg['arch']}: {eg['reason'][:110]} |")
    ops = {}
    for r in cap:
        for u in r.get("unknown") or []:
            ops.setdefault(u["op"], []).append(r["arch"])
    if ops:
        lines += ["", "unknown ops (architectures): " + "; ".join(
            f"{k} ({len(v)}: {', '.join(v[:4])}{'...' if len(v) > 4 else ''})"
            for k, v in sorted(ops.items(), key=lambda kv: -len(kv[1])))]
    return "\n".join(lines)


def sample(archs, pool_files, n: int, seed: int) -> list:
    """n architectures of `archs` that captured in any of `pool_files`, drawn by a seeded RNG from the
    sorted pool (the same files and seed give the same list)."""
    import random
    pool = set()
    for path in pool_files:
        for r in load(path):
            if r.get("capture") or (r.get("column") is None and "unknown" in r):
                pool.add(r["arch"])
    return random.Random(seed).sample(sorted(pool & set(archs)), n)


def chosen(parser, names: list, only, refusal: str) -> list:
    """`names`, or the comma-separated `only` of them (argparse's error, `refusal` formatted with the
    unknown ones, for any other)."""
    if not only:
        return names
    want = only.split(",")
    bad = [w for w in want if w not in names]
    if bad:
        parser.error(refusal.format(bad=", ".join(bad), names=", ".join(names)))
    return want


def columns(parser, text: str) -> tuple:
    """The comma-separated columns of `text` (argparse's error for an unknown one)."""
    cols = tuple(c for c in text.split(",") if c)
    bad = [c for c in cols if c not in COLUMNS]
    if bad:
        parser.error(f"unknown column {bad[0]!r}: one of {', '.join(COLUMNS)}")
    return cols


def main(argv=None) -> int:
    global F64
    p = argparse.ArgumentParser(prog="python -m bench.hf_catalogue")
    p.add_argument("--out", default=DEFAULT_OUT, help="JSONL results (appended; done cases are skipped)")
    p.add_argument("--shard", default="0/1", help="i/n: every n-th architecture from the i-th")
    p.add_argument("--columns", default=",".join(COLUMNS))
    p.add_argument("--only", help="comma-separated model types")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--f64", choices=("differ", "all"), default=F64,
                   help="re-run in float64 (and judge by it, at 1e-9) only the rows over the float32 bar, or "
                        "every row")
    p.add_argument("--report", action="store_true", help="print the table of --out and exit")
    p.add_argument("--sample", type=int, help="N architectures drawn (seeded) from those that captured in --pool; "
                   "--only's are added after them")
    p.add_argument("--seed", type=int, default=0, help="the --sample draw's seed")
    p.add_argument("--pool", help="comma-separated JSONL files: a cheap row with capture, or a capture-only row "
                   "with an 'unknown' list, puts its architecture in the pool")
    a = p.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    F64 = a.f64
    from tests.emit_workers import hf_catalogue_models as C
    archs = list(C.catalogue())
    if a.report:
        print(report(load(a.out), attempted=len(archs)))
        return 0
    i, n = (int(v) for v in a.shard.split("/"))
    if a.sample:
        drawn = sample(archs, (a.pool or a.out).split(","), a.sample, a.seed)
        print("sample:", ",".join(drawn), flush=True)
        a.only = ",".join(drawn + [w for w in (a.only or "").split(",") if w and w not in drawn])
    archs = chosen(p, archs, a.only, "not in the catalogue: {bad}")[i::n]
    cols = columns(p, a.columns)
    # imported once in the parent, shared by every forked case
    import sapp.api  # noqa: F401
    import sapp.capture  # noqa: F401
    import sapp.emit  # noqa: F401
    import sapp.search.joint  # noqa: F401
    import transformers  # noqa: F401
    from tests.emit_workers import hf_harness, hf_plans  # noqa: F401
    run(archs, cols, a.out, a.timeout, a.workers, log=lambda s: print(s, flush=True))
    print(report(load(a.out), attempted=len(C.catalogue())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
