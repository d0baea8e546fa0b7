"""Step: data parallelism -- the stage wrapped for gradient sync over dp: DDP or one all-reduce
(ZeRO-0/1), FSDP2 (ZeRO-2/3); ZeRO-1's sharded optimizer states come with the optimizers step."""
from __future__ import annotations

from ..build import Layout, Made, Rank, RecomputePlan, Training
from ..dp import wrap


def apply(layout: Layout, rank: Rank, training: Training, recompute: RecomputePlan, made: Made, notes: list,
          s: int) -> None:
    """Reads stage `s` and what is kept out of the sync (`made.stages[s]`, `made.dp_excluded[s]`,
    `made.traced`), the layout (dp, tp, ep, ZeRO), the mesh and device, the recompute blocks (FSDP
    units) and the precision; writes `made.wrapped[s]`, `made.zero` (the stage that runs), a sync
    hook in `made.hooks` when the wrapper needs one, and notes."""
    # ZeRO-1 is synchronised like ZeRO-0 here: under TP not FSDP's ZeRO-2, with host placement not a
    # full optimizer per rank, and never whole tensors per rank (ZeroRedundancyOptimizer)
    w, hook, made.zero = wrap.wrap_dp(made.stages[s], dp=layout.dp, tp=layout.tp,
                                      zero=0 if layout.local_zero1 else layout.zero, mesh=rank.mesh,
                                      blocks=recompute.blocks, device=rank.device, notes=notes,
                                      staged=made.traced is not None, host_names=made.dp_excluded.get(s, ()),
                                      mixed=training.mixed,
                                      grad_sync="allreduce" if layout.ep > 1 else training.grad_sync)
    made.wrapped[s] = w
    if hook:
        made.hooks.append(hook)
