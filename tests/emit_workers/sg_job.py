"""One spawned gloo job for the stage-boundary scatter/gather emit test (tests/test_pipe_scatter_gather.py):
every rank emits the plan for gpt-tiny (no dropout), trains 3 steps on the zoo's synthetic batch (the last
under sapp.emit.runtime.memory_meter.MemoryMeter) and writes its losses, memory, manifest and the bytes its
pipeline stage sends per micro-batch (torch.distributed.pipelining's own output metadata: what it
sends to the next stage).

    python -m tests.emit_workers.sg_job WORLD PLAN.json OUT.json GLOBAL_BATCH"""
from __future__ import annotations

import json
import os
import sys
import traceback

from tests.emit_workers.harness import fork_ranks
from tests.emit_workers.sp_job import single_process_losses


def _sent_bytes(prog):
    """Bytes per micro-batch each of this rank's stages hands PipelineStage to send (its outputs)."""
    sched = prog.schedule
    stages = getattr(sched, "_stages", None) or [getattr(sched, "_stage")]
    out = {}
    for st in stages:
        metas = st._stage_meta.outputs or ()
        n = 0
        for m in metas:
            numel = 1
            for d in m.shape:
                numel *= int(d)
            n += numel * m.dtype.itemsize
        out[str(st.stage_index)] = {"bytes": n, "shapes": [list(m.shape) for m in metas], "is_last": st.is_last}
    return out


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
               "expected": prog.manifest_expected, "stage": prog.stage_indices[0], "notes": prog.notes,
               "sent": _sent_bytes(prog), "coords": list(prog.coords)}
        dist.destroy_process_group()
    except BaseException:
        out = {"error": traceback.format_exc()[-3000:]}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    world, plan_path, out_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    failed, per_rank = fork_ranks(_worker, world, [{"plan": plan_path}])
    with open(out_path, "w") as f:
        json.dump({"failed": failed, "ranks": per_rank, "single": single_process_losses(int(sys.argv[4]))}, f)
    sys.exit(0)
