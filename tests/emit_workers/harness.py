"""Run several emit cases in ONE spawned gloo job (spawning costs seconds; cases reuse the processes).

    python -m tests.emit_workers.harness WORLD CASES.json OUT.json

A case: {"id", "kind" (zoo.build), "plan" (make_plan kwargs), "steps", "batch"}.  Each rank writes what
it saw (losses, module types, recomputed modules, notes); the parent adds the single-process reference
losses.  Every rank ends with os._exit so a gloo/sparse-grad exit abort cannot fail the job."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback


def _worker(rank, world, cases, out_dir, store):
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    torch.set_num_threads(1)
    from sapp.emit import emit
    from tests.emit_workers import zoo
    from sapp.plan import Plan
    from tests.emit_workers.plans import make_plan
    results = {}
    code = 0
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=20))
        for case in cases:
            kind = case["kind"]
            model, loss_fn = zoo.build(kind)
            if case.get("plan_path"):           # a plan from sapp's own search
                plan = Plan.load(case["plan_path"])
            else:
                kw = dict(case["plan"])
                kw.setdefault("params", sum(p.numel() for p in model.parameters()))
                kw.setdefault("global_batch", case["batch"])
                plan = make_plan(**kw)
            x0, _ = zoo.batch(kind, case["batch"], 0)
            prog = emit(model, plan, loss_fn=loss_fn, lr=1e-3, example_inputs=x0,
                        check_fingerprint=case.get("check_fingerprint", False),
                        grad_sync=case.get("grad_sync", "auto"))
            losses = []
            for i in range(case["steps"]):
                x, y = zoo.batch(kind, case["batch"], i)
                xs, ys = prog.shard(x, y)
                losses.append(prog.step(xs, ys))
            params = prog.parameters
            results[case["id"]] = {
                "losses": losses, "coords": list(prog.coords), "notes": prog.notes, "recomputed": prog.recomputed,
                "module_types": [type(m).__name__ for m in prog.modules],
                "dtensor_params": sum(1 for p in params if type(p.data).__name__ == "DTensor" or hasattr(p, "placements")),
                "local_numel": sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in params),
                "optimizers": [type(o).__name__ for o in prog.optimizers], "zero": prog.zero,
                "precision": prog.precision,
                "stages": prog.stage_indices,
                "host_modules": sorted(n for m in prog.modules for n, x in m.named_modules()
                                       if type(x).__name__ == "HostEmbedding"),
                "tied_sums": {n: float((p.to_local() if hasattr(p, "to_local") else p).detach().double().sum())
                              for m in prog.modules for n, p in m.named_parameters(remove_duplicate=False)
                              if n.endswith(("wte.weight", "lm_head.weight"))}, "first": prog.first_stage, "last": prog.last_stage,
            }
            with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
                json.dump(results, f)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        results["error"] = traceback.format_exc()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def warm(builders=()):
    """Import, in the parent before it forks, what every rank would otherwise import (and pay for) on its
    own: dynamo / export / sympy (a pipeline's stage tracing), DTensor, FSDP, the pipelining runtime, sapp's
    emitter; `builders` are called once (a model built on meta imports its modeling code), and a toy
    export runs once so its first-call set-up is done.  Imports and meta/fake tensors only: no real
    compute runs in the parent before the fork, so the ranks start from the same state as before (their
    own seeds, weights and thread settings).  Measured: a rank's first case took ~10 s CPU, the next ~1.5 s."""
    import torch
    import torch._dynamo  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.pipelining  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401
    import torch.export
    import sapp.emit  # noqa: F401
    import sapp.emit.runtime.memory_meter  # noqa: F401
    import sapp.plan  # noqa: F401
    rng = torch.get_rng_state()         # builders seed: the ranks still fork from the parent's RNG state
    for build in builders:
        build()
    with torch.device("meta"):
        toy = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    torch.export.export(toy, (torch.empty(2, 4, device="meta"),))
    torch.set_rng_state(rng)


def finish(out_dir, rank, out: dict):
    """A forked rank's last act: write what it has to out_dir/rank<r>.json and leave at once (no
    atexit handlers of the parent's)."""
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    sys.stdout.flush()
    os._exit(0)


def gloo_rank(rank, world, store, out_dir, run, timeout_s: float = 60.0):
    """A forked rank of a test's job: gloo over the file `store`, `run()` -> this rank's results, then
    a barrier; any error goes to the test in res["error"] (with the traceback's tail); always ends by
    writing out_dir/rank<r>.json and leaving at once, non-zero on error."""
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    torch.set_num_threads(1)
    res, code = {}, 0
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        res = run()
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:                 # noqa: BLE001 - reported to the test
        res["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"
        code = 1
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    os._exit(code)


def spawn_cases(module: str, cases: list, timeout: float, world: int = 2) -> dict:
    """{rank: results} of `python -m module CASES.json OUT.json` in a process of its own (a test's
    `__main__` forks the ranks: forking inside an xdist worker can hang); every rank must report
    and none may have failed."""
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "cases.json"), "w") as f:
            json.dump(cases, f)
        out = os.path.join(tmp, "out.json")
        subprocess.run([sys.executable, "-m", module, os.path.join(tmp, "cases.json"), out],
                       cwd=root, timeout=timeout, check=False, env=dict(os.environ, PYTHONPATH=root))
        with open(out) as f:
            got = json.load(f)
    assert len(got) == world, got
    for g in got.values():
        assert "error" not in g, g["error"]
    return got


def fork_ranks(worker, world: int, cases: list, builders=()):
    """Fork `world` ranks running worker(rank, world, cases, tmp, store) (each writes tmp/rank<r>.json);
    returns (the first line of a rank's failure or None, {rank: what it wrote}).  A rank that exits
    non-zero does not lose what the others wrote.  `warm(builders)` runs first (once, in the parent)."""
    import torch.multiprocessing as mp
    warm(builders)
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        ctx = mp.start_processes(worker, args=(world, cases, tmp, store), nprocs=world, join=False,
                                 start_method="fork")
        failed = None
        try:
            while not ctx.join():
                pass
        except Exception as e:   # a rank exited non-zero: keep what the ranks wrote
            failed = str(e).splitlines()[0] if str(e) else type(e).__name__
        per_rank = {}
        for r in range(world):
            p = os.path.join(tmp, f"rank{r}.json")
            if os.path.exists(p):
                with open(p) as f:
                    per_rank[r] = json.load(f)
    return failed, per_rank


def cases_main(rank_fn, world: int = 2) -> None:
    """The `__main__` of a test module that spawn_cases runs: read the cases from argv[1], fork the
    ranks of rank_fn(rank, world, cases, out_dir, store), write {rank: results} to argv[2]."""
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    per = fork_ranks(rank_fn, world, cases)[1]
    with open(sys.argv[2], "w") as f:
        json.dump({str(k): v for k, v in per.items()}, f)


def main(argv):
    world, cases_path, out_path = int(argv[0]), argv[1], argv[2]
    with open(cases_path) as f:
        cases = json.load(f)
    from tests.emit_workers import zoo
    failed, per_rank = fork_ranks(_worker, world, cases)
    out = {"failed": failed, "errors": {r: v["error"] for r, v in per_rank.items() if "error" in v}, "cases": {}}
    refs = {}
    for case in cases:
        placement = case.get("plan", {}).get("placement_groups")
        key = (case["kind"], case["steps"], case["batch"], json.dumps(placement, sort_keys=True))
        if key not in refs:
            refs[key] = zoo.reference(*key[:3], placement=placement)
        out["cases"][case["id"]] = {"ref": refs[key],
                                    "ranks": {r: v.get(case["id"]) for r, v in sorted(per_rank.items())}}
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
