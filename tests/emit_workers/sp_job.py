"""One spawned gloo job for the sequence-parallel emit tests (tests/test_sp_emit.py): every rank emits
the plan for gpt-tiny (no dropout), trains 3 steps on the zoo's synthetic batch (the last under
sapp.emit.runtime.memory_meter.MemoryMeter) and writes its losses, memory and manifest.

    python -m tests.emit_workers.sp_job WORLD PLAN.json OUT.json"""
from __future__ import annotations

import json
import os
import sys
import traceback

from tests.emit_workers.harness import fork_ranks


def _worker(rank, world, cases, out_dir, store):
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    torch.set_num_threads(1)
    out = {}
    try:
        import sapp.models as models
        from sapp.emit import emit
        from sapp.emit.runtime.memory_meter import MemoryMeter
        from sapp.plan import Plan
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=30))
        plan = Plan.load(cases[0]["plan"])
        torch.manual_seed(0)
        model = models.get("gpt-tiny", device="cpu", dropout=0.0)
        gb = int(plan.model["global_batch"])
        x, y = models.example_inputs(model, gb, "cpu"), models.example_targets(model, gb, "cpu")
        prog = emit(model, plan, lr=1e-3, example_inputs=x, check_fingerprint=False)
        losses = [prog.step(*prog.shard(x, y)) for _ in range(2)]
        with MemoryMeter(prog) as meter:
            losses.append(prog.step(*prog.shard(x, y)))
        out = {"losses": losses, "measured": meter.result(), "manifest": prog.manifest,
               "expected": prog.manifest_expected, "stage": prog.stage_indices[0], "notes": prog.notes}
        dist.destroy_process_group()
    except BaseException:
        out = {"error": traceback.format_exc()[-3000:]}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    sys.stdout.flush()
    os._exit(0)


def single_process_losses(global_batch: int, steps: int = 3) -> list:
    """The same model and data trained in one process with plain Adam: the reference."""
    import torch
    import sapp.models as models
    from sapp.emit.runtime.program import default_loss
    torch.manual_seed(0)
    model = models.get("gpt-tiny", device="cpu", dropout=0.0)
    x, y = models.example_inputs(model, global_batch, "cpu"), models.example_targets(model, global_batch, "cpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = default_loss(model(*x), y[0] if isinstance(y, tuple) else y)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


if __name__ == "__main__":
    world, plan_path, out_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    failed, per_rank = fork_ranks(_worker, world, [{"plan": plan_path}])
    with open(out_path, "w") as f:
        json.dump({"failed": failed, "ranks": per_rank, "single": single_process_losses(int(sys.argv[4]))}, f)
    sys.exit(0)
