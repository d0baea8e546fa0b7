"""Two gloo ranks that build tab-transformer-pytorch's FT-Transformer with the same torch seed but a
different Python `random` state (as two processes have), emit a dp2 plan and train 3 Adam steps.

    python -m tests.emit_workers.same_start_job PLAN.json OUT.json

Each rank writes its losses, its notes and its parameters after the steps."""
from __future__ import annotations

import json
import os
import random
import sys
import tempfile


def _worker(rank, plan_path, store, out_dir):
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    torch.set_num_threads(1)
    from sapp.emit import emit
    from sapp.plan import Plan
    from tests.emit_workers import lib_models
    out = {}
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                                timeout=timedelta(seconds=60))
        random.seed(1000 + rank)               # two processes' Python generators differ
        model, loss_fn = lib_models.build("ft_transformer", seed=0)
        x, _ = lib_models.batch("ft_transformer", 8, 0)
        prog = emit(model, Plan.load(plan_path), loss_fn=loss_fn, rank=rank, world=2, example_inputs=x,
                    check_fingerprint=False)       # (as tests/emit_workers/hf_harness.py: a loss of its own)
        out["losses"] = [float(prog.step(*lib_models.batch("ft_transformer", 8, s))) for s in range(3)]
        out["notes"] = list(prog.notes)
        out["params"] = {n: p.detach().double().reshape(-1).tolist() for n, p in model.named_parameters()}
    except Exception as e:                     # noqa: BLE001 - reported to the parent
        import traceback
        out["error"] = "".join(traceback.format_exception(e))[-3000:]
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(out, f)
    os._exit(0)


def main(plan_path, out_path):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_worker, args=(r, plan_path, os.path.join(tmp, "store"), tmp)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(240)
        ranks = {}
        for r in range(2):
            path = os.path.join(tmp, f"{r}.json")
            ranks[r] = json.load(open(path)) if os.path.exists(path) else {"error": "no result"}
    with open(out_path, "w") as f:
        json.dump(ranks, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
