"""Run searched plans in ONE spawned gloo job per world size and report, per rank, the manifest next to
the plan's and the measured memory next to the predicted (the truth matrix: tests/test_truth_matrix.py,
bench/truth_matrix.py).

    python -m tests.emit_workers.truth_job WORLD CASES.json OUT.json

A case: {"id", "model" (zoo name), "model_args" ({}), "plan_path", "steps" (>= 2), "time_steps" (0: none)}.  Each rank trains
`steps` steps on the zoo's synthetic batch at the plan's global batch; the last one runs under
sapp.emit.runtime.memory_meter.MemoryMeter (the first ones create the optimizer states); then `time_steps`
unmetered steps are timed (bench/truth_matrix.py's step-time truth).  A case that raises
records its error and the job goes on with the next (the ranks raise together: the same plan fails the
same way everywhere, or the collective times out in 20 s)."""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from tests.emit_workers.harness import fork_ranks


def predicted_memory(plan, stage: int) -> dict:
    """The plan's memory breakdown for one pipeline stage (pp = 1: the only one)."""
    stages = plan.pipeline.get("stages") or []
    for s in stages:
        if s.get("index") == stage and (s.get("predicted") or {}).get("memory"):
            return dict(s["predicted"]["memory"])
    return dict(plan.predicted.get("memory") or {})


def run_case(case, rank):
    import torch
    import sapp.models as models
    from sapp.emit import emit
    from sapp.emit.runtime.memory_meter import MemoryMeter
    from sapp.plan import Plan
    plan = Plan.load(case["plan_path"])
    torch.manual_seed(0)
    model = models.get(case["model"], device="cpu", **case.get("model_args", {}))
    gb = int(plan.model["global_batch"])
    x = models.example_inputs(model, gb, "cpu")
    y = models.example_targets(model, gb, "cpu")
    prog = emit(model, plan, lr=1e-3, example_inputs=x, check_fingerprint=False)
    losses = []
    steps = max(2, int(case.get("steps", 2)))
    for i in range(steps - 1):
        losses.append(prog.step(*prog.shard(x, y)))
    with MemoryMeter(prog) as meter:
        losses.append(prog.step(*prog.shard(x, y)))
    # step time: `time_steps` more steps, unmetered (each ends in the loss all-reduce every rank leaves
    # together); wall and this process's CPU time per step
    step_s, cpu_s = [], []
    for _ in range(int(case.get("time_steps", 0))):
        w, c = time.perf_counter(), time.process_time()
        prog.step(*prog.shard(x, y))
        step_s.append(time.perf_counter() - w)
        cpu_s.append(time.process_time() - c)
    stage = prog.stage_indices[0]
    return {"losses": losses, "coords": list(prog.coords), "stage": stage, "stages": prog.stage_indices,
            "manifest": prog.manifest, "expected": prog.manifest_expected, "mismatches": prog.mismatches,
            "notes": prog.notes, "measured": meter.result(), "predicted": predicted_memory(plan, stage),
            "unpriced_recompute": getattr(prog, "recompute_unpriced", {}), "step_s": step_s, "cpu_s": cpu_s}


def _worker(rank, world, cases, out_dir, store):
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    torch.set_num_threads(1)
    results, code = {}, 0
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=30))
        for case in cases:
            try:
                results[case["id"]] = run_case(case, rank)
            except Exception as e:
                results[case["id"]] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                                       "trace": traceback.format_exc()[-2000:]}
            dist.barrier()
            with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
                json.dump(results, f)
        dist.destroy_process_group()
    except BaseException:
        results["__job__"] = {"error": traceback.format_exc()}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_job(world: int, cases: list, out_path: str) -> dict:
    """In this process (the parent must not have run torch work yet: the ranks are forked)."""
    failed, per_rank = fork_ranks(_worker, world, cases)
    out = {"failed": failed, "cases": {c["id"]: {str(r): v.get(c["id"]) for r, v in sorted(per_rank.items())}
                                       for c in cases},
           "job_errors": {r: v["__job__"]["error"] for r, v in per_rank.items() if "__job__" in v}}
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    w, cases_path, out_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    with open(cases_path) as f:
        run_job(w, json.load(f), out_path)
    sys.exit(0)
