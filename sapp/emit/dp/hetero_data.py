"""Uneven data shares over a mixed cluster (sapp.hetero-plan/1, mode "data").

Each group trains its share of the global batch, split evenly over the group's data-parallel ranks,
so ranks hold different numbers of samples.  The plain data-parallel average (each rank's mean loss,
gradients summed and divided by the ranks: parallel.GradAllReduce) would then weigh a sample of a
small share more than one of a large share.  Here each rank's gradient of its mean loss is scaled by
its share of the global batch (= the gradient of its loss sum divided by the global batch) and the
gradients are summed over every rank: the update is one process's on the whole batch."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ...errors import PlanError


def rank_slices(doc) -> list:
    """[(start, stop)] of the global batch for every rank: groups in the plan's order, each group's
    share split evenly over its data-parallel ranks (its devices, in this emitter)."""
    out, start = [], 0
    for g in doc["groups"]:
        b, n = g["batch_share"], g["devices"]
        par = g.get("parallel") or {"dp": n, "tp": 1, "pp": 1}
        if b and (par.get("tp", 1) != 1 or par.get("pp", 1) != 1 or par.get("dp") != n):
            raise PlanError(f"group {g['name']} runs tp={par.get('tp')} pp={par.get('pp')}: uneven shares are emitted "
                            f"for data-parallel groups only; pin tp=1 pp=1 or run the group's plan alone")
        if b % n:
            raise PlanError(f"group {g['name']}: share {b} does not split over its {n} devices; re-run the search")
        for _ in range(n):
            out.append((start, start + b // n))
            start += b // n
    if start != doc["model"]["global_batch"]:
        raise PlanError("mixed-cluster plan: the shares do not add up to the global batch")
    return out


class WeightedGradSum:
    """After backward of this rank's mean loss: gradient x (its samples / global batch), summed over
    the group of all ranks in one flat all-reduce."""

    def __init__(self, params, weight: float, group=None):
        self.params = [p for p in params if p.requires_grad]
        self.weight = float(weight)
        self.group = group

    def __call__(self):
        for p in self.params:
            if p.grad is None:        # a rank whose share never reached a parameter still sends zeros
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        flat *= self.weight
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()


def for_rank(doc, rank: int, params, group=None):
    """(this rank's (start, stop) of each global batch, its gradient hook)."""
    slices = rank_slices(doc)
    if rank >= len(slices):
        raise PlanError(f"rank {rank} is outside the plan's {len(slices)} devices; launch {len(slices)} processes")
    start, stop = slices[rank]
    return (start, stop), WeightedGradSum(params, (stop - start) / doc["model"]["global_batch"], group)
