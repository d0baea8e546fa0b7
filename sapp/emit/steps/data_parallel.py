"""Step: data parallelism -- the stage wrapped for gradient sync over dp: DDP or one all-reduce
(ZeRO-0/1), FSDP2 (ZeRO-2/3); ZeRO-1's sharded optimizer states come with the optimizers step."""
from __future__ import annotations

from ..build import Build
from ..dp import wrap


def apply(b: Build, s: int) -> None:
    # ZeRO-1 is synchronised like ZeRO-0 here: under TP not FSDP's ZeRO-2, with host placement not a
    # full optimizer per rank, and never whole tensors per rank (ZeroRedundancyOptimizer)
    w, hook, b.zero = wrap.wrap_dp(b.stages[s], dp=b.dp, tp=b.tp, zero=0 if b.local_zero1 else b.plan.zero,
                                       mesh=b.mesh, blocks=b.blocks, device=b.device, notes=b.notes,
                                       staged=b.traced is not None, host_names=b.dp_excluded.get(s, ()),
                                       mixed=b.mixed, grad_sync="allreduce" if b.ep > 1 else b.grad_sync)
    b.wrapped[s] = w
    if hook:
        b.hooks.append(hook)
