"""Plan -> running torch.distributed training program.

    sapp.emit.runtime.dist.init()                        # from the torchrun environment (gloo / nccl, 20 s timeout)
    torch.manual_seed(0); model = sapp.models.get("gpt-tiny", device="cpu")   # same weights on every rank
    prog = sapp.emit.emit(model, plan, lr=1e-3, example_inputs=x)
    for x, y in batches:                         # global batches, identical on every rank
        loss = prog.step(*prog.shard(x, y))      # this rank's dp shard in, global mean loss out

`sapp run plan.json --model NAME` (sapp/commands/run.py) does exactly this in one process per device
with torchrun, running sapp/emit/runtime/worker.py in each.  `emit` compares what it built with the plan
(sapp/emit/checks/manifest.py, `prog.manifest`): a difference is a PlanError naming the field, or with
allow_mismatch=True a loud note and `prog.repriced`, the prediction of what really runs.  Which torch runtime implements which plan
feature is listed in sapp/emit/tp/parallel.py and sapp/emit/pp/pipe.py."""
from .runtime.program import Program, emit

__all__ = ["emit", "Program"]
