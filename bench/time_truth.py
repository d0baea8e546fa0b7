"""Overlap truth: does each emitted program run its work in the order its price assumes?
`python -m bench.time_truth [--cases id,...] [--json out.json]`

Plans of the zoo GPT are searched on the `cpu` preset with pinned layouts, emitted, and one training step
per plan runs under the torch profiler on 2 gloo ranks (1 for the dp = 1 offload case) after an unprofiled
warm-up step.  Pipeline actions are logged from the stages' own forward/backward calls (the profiler
sees no schedule events).  From the timeline each rank checks the *ordering* relation behind every
overlap the cost model prices for that plan -- machine-independent (which work starts before which
ends), not absolute times, so a loaded CPU does not change the verdict.

The priced overlaps (docs/ARCHITECTURE.md "Gradient-sync overlap", "FSDP2 all-gather prefetch";
sapp/costmodel/gradsync.py; sapp/placement/cost.py; sapp/pipeline/schedule.py) and the relation each
needs; `rule` is the plan's `settings.grad_sync_overlap_rule`:
  grad sync, rule "none" (CPU; TP or a pipeline at ZeRO-0/1): nothing hidden, the flat all-reduce
      starts after the last backward node ends                                  -> sync-after-backward
  grad sync, rule "ddp-buckets" (ZeRO-0/1, no TP/pipeline, CUDA): DDP all-reduces a bucket as backward
      fills it; only the first parameters' bucket waits for backward's end.  Emitted on CUDA; here
      forced with emit(grad_sync="ddp") on gpt-small (2 DDP buckets: DDP's 1 MB first bucket)
                                                   -> a bucket all-reduce starts before backward's last node
  grad sync, rule "fsdp-units" (ZeRO-2/3): each unit's reduce-scatter is issued when its backward ends,
      while backward goes on; the root's (glue) is exposed -> every block's reduce starts before backward ends
  ZeRO-3 all-gather prefetch, backward: unit j-1's gather is issued before unit j's backward ends
      (FSDP2's explicit backward prefetch)                           -> gather(j-1) starts before reduce(j)
      (the forward prefetch is the CUDA stream running behind the CPU: not observable on a CPU)
  pipeline schedule: the per-device order of forwards and backwards the simulator prices
      (schedule._orders) is the order the stage runs                          -> pipeline-order
  optimizer offload, dp = 1: per parameter group, gradient copy -> CPU Adam -> weight copy pipelined
      inside the last backward (OffloadAdam(overlap=True))  -> every group's Adam starts before backward ends
  optimizer offload, dp > 1: priced as run, after the gradient sync    -> offload Adam after backward
  host embedding tables: priced as run (the lookup of micro-batch k+1 waits for k's backward: its
      gradient copy to the host is the last node of backward)       -> lookup(k+1) after backward(k)
A relation that fails means the plan's price assumes an order the program does not run: fix the
emitter or the price.  The CI slice is tests/test_time_truth.py."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEV = {"optimizer": "device"}
# (id, model, world, global batch, constraints, emit grad_sync)
CASES = [
    ("dp2-z0-flat", "gpt-tiny", 2, 8, {"dp": 2, "tp": 1, "pp": 1, "zero": 0, "placement": _DEV}, "auto"),
    ("dp2-z0-ddp", "gpt-small", 2, 4, {"dp": 2, "tp": 1, "pp": 1, "zero": 0, "placement": _DEV}, "ddp"),
    ("dp2-z2", "gpt-tiny", 2, 8, {"dp": 2, "tp": 1, "pp": 1, "zero": 2, "placement": _DEV}, "auto"),
    ("dp2-z3", "gpt-tiny", 2, 8, {"dp": 2, "tp": 1, "pp": 1, "zero": 3, "placement": _DEV}, "auto"),
    ("tp2", "gpt-tiny", 2, 8, {"dp": 1, "tp": 2, "pp": 1, "zero": 0, "placement": _DEV}, "auto"),
    ("pp2-1f1b-m4", "gpt-tiny", 2, 8, {"dp": 1, "tp": 1, "pp": 2, "schedule": "1f1b", "micro_batches": 4,
                                       "zero": 0, "placement": _DEV}, "auto"),
    ("pp2-gpipe-m4", "gpt-tiny", 2, 8, {"dp": 1, "tp": 1, "pp": 2, "schedule": "gpipe", "micro_batches": 4,
                                        "zero": 0, "placement": _DEV}, "auto"),
    ("offload-dp1", "gpt-tiny", 1, 8, {"dp": 1, "tp": 1, "pp": 1, "zero": 0, "placement": {"optimizer": "host"}},
     "auto"),
    ("offload-dp1-m2", "gpt-tiny", 1, 8, {"dp": 1, "tp": 1, "pp": 1, "zero": 0, "micro_batches": 2,
                                          "placement": {"optimizer": "host"}}, "auto"),
    ("offload-dp2", "gpt-tiny", 2, 8, {"dp": 2, "tp": 1, "pp": 1, "zero": 0, "placement": {"optimizer": "host"}},
     "auto"),
]
QUICK = ("dp2-z0-flat", "dp2-z3", "pp2-1f1b-m4", "offload-dp1-m2")


def search_plans(cases, tmp) -> list:
    """[{id, model, world, grad_sync, plan_path, rule, priced}] for `cases` (CASES rows)."""
    import sapp
    import sapp.models as models
    from sapp.api import search
    out = []
    for cid, model, world, gb, cons, gs in cases:
        plan = search(models.get(model, device="meta"), sapp.Cluster.parse(f"cpu:gpus={world}"), global_batch=gb,
                      constraints=cons)
        path = os.path.join(tmp, cid + ".json")
        plan.save(path)
        place = (plan.placement or {}).get("predicted") or {}
        comp = (place.get("components") or {}).get("optimizer") or {}
        out.append({"id": cid, "model": model, "world": world, "grad_sync": gs, "plan_path": path,
                    "rule": (plan.settings or {}).get("grad_sync_overlap_rule", "none"),
                    "schedule": plan.pipeline.get("schedule", "none"), "m": plan.pipeline.get("micro_batches", 1),
                    "offload_pipelined": comp.get("pipelined"), "placement": sorted((plan.placement or {}).get("groups") or {})})
    return out


# ---- one rank ---------------------------------------------------------------------------------------
def _events(prof):
    return [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()]


def _is_node(name):
    return name.startswith("autograd::engine::evaluate_function: ")


def _compute_node(name):
    # a backward compute node: not the leaf accumulation (where DDP / OffloadAdam hooks run) nor
    # FSDP2's post-backward bookkeeping nodes
    return _is_node(name) and "AccumulateGrad" not in name and "PostBackward" not in name


def relations(case, ev, pipe_log, rank) -> list:
    """[(relation, holds, detail)] for one rank's timeline `ev` [(name, start, end)] of one step."""
    out = []
    nodes = [e for e in ev if _is_node(e[0])]
    compute = [e for e in nodes if _compute_node(e[0])]
    if not nodes:
        return [("backward seen", False, "no autograd node in the profile")]
    bwd_end = max(e[2] for e in nodes)
    last_compute_end = max(e[2] for e in compute)
    opt = [e for e in ev if e[0].startswith("Optimizer.step#") or e[0].startswith("sapp.offload_adam.after")]
    rule, cid = case["rule"], case["id"]
    ar = sorted(e for e in ev if e[0] == "c10d::allreduce_" and e[1] < min((o[1] for o in opt), default=float("inf")))
    if case["schedule"] in ("none", None) and not cid.startswith("offload"):
        if case["grad_sync"] == "ddp":
            early = [e for e in ar if e[1] < last_compute_end]
            out.append(("ddp-buckets: a bucket all-reduce starts before backward's last node ends", bool(early),
                        f"{len(ar)} bucket all-reduces, {len(early)} started during backward"))
        elif "z2" in cid or "z3" in cid:
            red = {e[0].split("(")[-1].rstrip(")"): e for e in ev if e[0].startswith("FSDP::post_backward_reduce (")}
            blocks = sorted(k for k in red if k)
            early = [b for b in blocks if red[b][1] < last_compute_end]
            out.append(("fsdp-units: every block's reduce-scatter starts before backward ends",
                        bool(blocks) and early == blocks, f"blocks {blocks}, issued during backward: {early}"))
            if "z3" in cid:
                gathers = sorted(e for e in ev if e[0].startswith("FSDP::all_gather (layers."))
                ok, det = True, []
                for j in range(1, len(blocks)):
                    prev, cur = f"layers.{j - 1}", f"layers.{j}"
                    bg = [e for e in gathers if e[0].endswith(f"({prev})") and e[1] > min(e2[1] for e2 in nodes)]
                    hit = bool(bg) and cur in red and bg[0][1] < red[cur][1]
                    ok &= hit
                    det.append(f"gather({prev}) before reduce({cur}): {hit}")
                out.append(("zero3 backward prefetch: unit j-1's gather starts before unit j's backward ends", ok,
                            "; ".join(det)))
        else:
            late = all(e[1] >= bwd_end for e in ar)
            out.append((f"rule {rule}: every gradient all-reduce starts after backward ends", bool(ar) and late
                        if case["world"] > 1 and "tp" not in cid else late, f"{len(ar)} all-reduces before the optimizer"))
    if case["schedule"] not in ("none", None):
        from sapp.pipeline.schedule import _orders
        want = [(k, j) for k, j, _ in _orders(case["schedule"], case["world"], case["m"], 1)[rank]]
        out.append((f"pipeline order ({case['schedule']}, m={case['m']}) as the simulator prices it",
                    pipe_log == want, f"ran {pipe_log[:8]}...; priced {want[:8]}..."))
    if cid.startswith("offload"):
        groups = sorted(e for e in ev if e[0].startswith("sapp.offload_adam.group"))
        after = [e for e in ev if e[0] == "sapp.offload_adam.after_backward"]
        if case["offload_pipelined"]:
            early = [e for e in groups if e[1] < bwd_end]
            out.append(("offload (dp=1, priced pipelined): every group's CPU Adam starts inside the last backward",
                        bool(groups) and len(early) == len(groups) and not after,
                        f"{len(early)}/{len(groups)} groups inside backward, {len(after)} after"))
        else:
            out.append(("offload (dp>1, priced after backward): CPU Adam starts after backward ends",
                        not groups and bool(after) and all(e[1] >= bwd_end for e in after),
                        f"{len(groups)} groups inside backward, {len(after)} after"))
    return out


def run_case(case, rank):
    import torch
    from torch.profiler import ProfilerActivity, profile
    import sapp.models as models
    from sapp.emit import emit
    from sapp.plan import Plan
    plan = Plan.load(case["plan_path"])
    torch.manual_seed(0)
    model = models.get(case["model"], device="cpu")
    gb = int(plan.model["global_batch"])
    x, y = models.example_inputs(model, gb, "cpu"), models.example_targets(model, gb, "cpu")
    prog = emit(model, plan, lr=1e-3, example_inputs=x, check_fingerprint=False, grad_sync=case["grad_sync"])
    log = []
    sched = prog.schedule
    for st in (getattr(sched, "_stages", None) or [getattr(sched, "_stage", None)]) if sched is not None else []:
        _log_stage(st, log)
    prog.step(*prog.shard(x, y))
    log.clear()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        prog.step(*prog.shard(x, y))
    rel = relations(case, _events(prof), list(log), prog.stage_indices[0])
    return [{"relation": r, "holds": bool(h), "detail": d} for r, h, d in rel]


def _log_stage(stage, log):
    """Record (kind, micro-batch) of each forward / backward the schedule runs on `stage`."""
    fwd, bwd = stage.forward_one_chunk, stage.backward_one_chunk

    def f(mb, *a, **k):
        log.append(("fwd", mb))
        return fwd(mb, *a, **k)

    def b(mb, *a, **k):
        log.append(("bwd", mb))
        return bwd(mb, *a, **k)
    stage.forward_one_chunk, stage.backward_one_chunk = f, b


# ---- driver -----------------------------------------------------------------------------------------
def run(ids=None, timeout=600) -> list:
    """Search, emit and run the cases (all, or `ids`); one row per (case, rank, relation)."""
    cases = [c for c in CASES if ids is None or c[0] in ids]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        found = search_plans(cases, tmp)
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for world in sorted({c["world"] for c in found}):
            mine = [c for c in found if c["world"] == world]
            cp, op = os.path.join(tmp, f"c{world}.json"), os.path.join(tmp, f"o{world}.json")
            with open(cp, "w") as f:
                json.dump(mine, f)
            proc = subprocess.run([sys.executable, "-m", "bench.time_truth", "--job", str(world), cp, op], cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=timeout)
            if not os.path.exists(op):
                raise RuntimeError(f"time-truth job for {world} ranks wrote nothing: {proc.stderr[-2000:]}")
            with open(op) as f:
                got = json.load(f)
            for c in mine:
                for rank, per in sorted(got["ranks"].items()):
                    if "__job__" in per:
                        raise RuntimeError(f"time-truth rank {rank} failed: {per['__job__']['error'][-1500:]}")
                    r = per.get(c["id"])
                    if isinstance(r, dict):
                        rows.append({"id": c["id"], "rank": int(rank), "rule": c["rule"], "relation": "run",
                                     "holds": False, "detail": r["error"]})
                        continue
                    for x in r or []:
                        rows.append({"id": c["id"], "rank": int(rank), "rule": c["rule"], **x})
    return rows


def table(rows) -> str:
    lines = [f"{'plan':16s} {'rank':>4s} {'holds':>5s}  relation (detail)"]
    for r in rows:
        lines.append(f"{r['id']:16s} {r['rank']:>4d} {'yes' if r['holds'] else 'NO':>5s}  {r['relation']} ({r['detail']})")
    ok = sum(r["holds"] for r in rows)
    lines.append(f"{ok}/{len(rows)} relations hold over {len({r['id'] for r in rows})} plans")
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--job":
        from bench.gloo_job import job
        job(run_case, int(argv[1]), argv[2], argv[3])
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.time_truth")
    ap.add_argument("--cases", help="comma-separated ids (default: all): " + ",".join(c[0] for c in CASES))
    ap.add_argument("--quick", action="store_true", help="the CI slice: " + ",".join(QUICK))
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    ids = set(a.cases.split(",")) if a.cases else (set(QUICK) if a.quick else None)
    rows = run(ids)
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["holds"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
