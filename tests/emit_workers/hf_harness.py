"""Emit Hugging Face models (tests/emit_workers/hf_models.py) under saved plans in ONE spawned gloo job.

    python -m tests.emit_workers.hf_harness WORLD CASES.json OUT.json

A case: {"id", "kind", "plan_path", "steps", "batch", optional "meter" (the last step under
sapp.emit.runtime.memory_meter), optional "dtype" ("float64": model, batches and the reference built in
float64 on every rank and in the parent, hf_models.default_dtype)}.  Each rank records its losses
and the bytes its pipeline stages send (or its error, as one line, and goes on with the next case
when the failure was local to emit); the parent adds the single-process reference losses and the
case's wall time.  Ranks end with os._exit (gloo teardown)."""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from tests.emit_workers.harness import fork_ranks
from tests.emit_workers import joblock


def _run_case(case, rank):
    from tests.emit_workers import hf_models
    with hf_models.default_dtype(case.get("dtype")):
        return _run_case_in(case, rank)


def _run_case_in(case, rank):
    import torch.distributed as dist
    from sapp.emit import emit
    from sapp.plan import Plan
    from tests.emit_workers import hf_models
    model, loss_fn = hf_models.build(case["kind"])
    plan = Plan.load(case["plan_path"])
    x0, _ = hf_models.batch(case["kind"], case["batch"], 0)
    t0 = time.perf_counter()
    try:
        prog = emit(model, plan, loss_fn=loss_fn, lr=1e-3, example_inputs=x0, check_fingerprint=False)
    except Exception as e:          # raised alike on every rank before any collective (checks, preflight)
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
                "phase": "emit", "trace": traceback.format_exc()[-2500:]}
    losses, sends, measured = [], _record_sends(prog), None
    try:
        for i in range(case["steps"]):
            x, y = hf_models.batch(case["kind"], case["batch"], i)
            if case.get("meter") and i == case["steps"] - 1:      # the last step under the memory meter
                from sapp.emit.runtime.memory_meter import MemoryMeter
                with MemoryMeter(prog) as meter:
                    losses.append(prog.step(*prog.shard(x, y)))
                measured = meter.result()
            else:
                losses.append(prog.step(*prog.shard(x, y)))
        dist.barrier()
    except Exception as e:          # one line for the table; the next case may still run
        return {"error": f"step {len(losses)}: {type(e).__name__}: "
                         f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}", "phase": "step",
                "trace": traceback.format_exc()[-2500:]}
    return {"losses": losses, "notes": prog.notes, "wall_s": time.perf_counter() - t0,
            "replicas": _replicas(prog),
            "dtensor_params": sum(1 for p in prog.parameters if hasattr(p, "placements")),
            "sp": prog.manifest.get("sp"), "sp_expected": prog.manifest_expected.get("sp"),
            "tp_modules": prog.manifest.get("tp_modules"),
            "stage": prog.stage_indices[0], "measured": measured, "sends": sends}


def _replicas(prog) -> dict:
    """{name: [sum, sum of squares]} of the parameters this rank holds whole (not DTensor shards)
    after training: every tp rank must hold the same values, or a replicated weight stepped with a
    gradient only part of the model's (a rank-local partial sum) and the copies drifted apart, an
    error the losses can hide for a few steps."""
    out = {}
    for mod in prog.modules:
        for n, p in mod.named_parameters():
            if not hasattr(p, "placements"):
                d = p.detach().double()
                out[n] = [float(d.sum()), float((d * d).sum())]
    return out


def _record_sends(prog) -> dict:
    """What this rank's pipeline stages hand to the p2p layer: {"fwd": [[bytes of each tensor] per
    send], "bwd": [...]}, read off the isend ops PipelineStage builds (`get_fwd_send_ops`: the
    activations after a forward, `get_bwd_send_ops`: the input gradients after a backward), i.e. the
    bytes that really cross the boundary per micro-batch, whatever hooks cut the stage's output."""
    out = {"fwd": [], "bwd": []}
    sched = prog.schedule
    stages = getattr(sched, "_stages", None) or ([sched._stage] if sched is not None else [])
    for st in stages:
        for kind, attr in (("fwd", "get_fwd_send_ops"), ("bwd", "get_bwd_send_ops")):
            inner = getattr(st, attr)

            def wrapped(chunk, _inner=inner, _kind=kind):
                ops = _inner(chunk)
                if ops:
                    out[_kind].append([op.tensor.numel() * op.tensor.element_size() for op in ops])
                return ops
            setattr(st, attr, wrapped)
    return out


def _worker(rank, world, cases, out_dir, store):
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    torch.set_num_threads(1)
    results, code = {}, 0
    path = os.path.join(out_dir, f"rank{rank}.json")
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
        for case in cases:
            results[case["id"]] = _run_case(case, rank)
            with open(path, "w") as f:
                json.dump(results, f)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        results["error"] = traceback.format_exc()[-3000:]
        with open(path, "w") as f:
            json.dump(results, f)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(world: int, cases: list) -> dict:
    """Spawn `world` ranks over `cases`; {"failed", "errors", "cases": {id: {"ref", "ranks"}}}."""
    import functools
    from tests.emit_workers import hf_models
    kinds = sorted({c["kind"] for c in cases})
    failed, per_rank = fork_ranks(_worker, world, cases,
                                  builders=[functools.partial(hf_models.build, k, device="meta") for k in kinds])
    out = {"failed": failed, "errors": {r: v["error"] for r, v in per_rank.items() if "error" in v}, "cases": {}}
    refs = {}
    for case in cases:
        key = (case["kind"], case["steps"], case["batch"], case.get("dtype"))
        if key not in refs:
            params = {}
            with hf_models.default_dtype(case.get("dtype")):
                refs[key] = (hf_models.reference(*key[:3], params=params), params)
        out["cases"][case["id"]] = {"ref": refs[key][0], "ref_params": refs[key][1],
                                    "ranks": {str(r): v.get(case["id"]) for r, v in sorted(per_rank.items())}}
    return out


def job(world: int, pairs: list, tmp_path, steps: int = 3, timeout: int = 400) -> tuple:
    """Search a plan per (kind, config) (hf_plans.search_plan) and run them all in one spawned job;
    returns (cases as `run` gives them, {case id: plan dict}).  Asserts the job ran."""
    from tests.emit_workers import hf_plans
    cases = []
    for kind, cfg in pairs:
        path = hf_plans.search_plan(kind, cfg, tmp_path / f"{kind}-{cfg}.json")
        cases.append({"id": f"{kind}-{cfg}", "kind": kind, "plan_path": path, "steps": steps, "batch": hf_plans.BATCH})
    cpath, opath = tmp_path / "cases.json", tmp_path / "out.json"
    cpath.write_text(json.dumps(cases))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # hard timeout: a hung collective must fail the test, not the CI run
    proc = joblock.run([sys.executable, "-m", "tests.emit_workers.hf_harness", str(world), str(cpath), str(opath)],
                       cwd=root, capture_output=True, text=True, timeout=timeout)
    assert opath.exists(), proc.stderr[-3000:]
    out = json.loads(opath.read_text())
    assert not out["errors"], "\n".join(out["errors"].values())[-3000:]
    return out["cases"], {c["id"]: json.loads(open(c["plan_path"]).read()) for c in cases}


def main(argv):
    world, cases_path, out_path = int(argv[0]), argv[1], argv[2]
    with open(cases_path) as f:
        cases = json.load(f)
    out = run(world, cases)
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
