"""Uneven data shares over a mixed cluster (a plan with `groups`, mode "data").

Each group trains its share of the global batch, split evenly over the group's data-parallel ranks,
so ranks hold different numbers of samples.  The plain data-parallel average (each rank's mean loss,
gradients summed and divided by the ranks: parallel.GradAllReduce) would then weigh a sample of a
small share more than one of a large share.  Here each rank's gradient of its mean loss is scaled by
its share of the global batch (= the gradient of its loss sum divided by the global batch) and the
gradients are summed over every rank: the update is one process's on the whole batch.

Two ways to the same sum: WeightedGradSum after backward (one flat all-reduce of its own), or
`loss_scale`, which `sapp run` uses (sapp/emit/runtime/hetero_run.py): the rank's mean loss times
world x samples / global batch, so the emitted program's own mean over the ranks (DDP, FSDP2, the
flat all-reduce, ZeRO-1, host tables' hooks) is that weighted sum, and its global-loss mean is the
global batch's mean loss.  Every sample's loss gradient is then world / global batch x its own,
alike on every rank, so a norm that syncs batch statistics sees consistent gradients too.

Groups with no share (the search left them idle) get no ranks.  A group runs data parallelism only
here (tp = pp = cp = 1, dp = its devices): its layout inside is the group's plan's otherwise."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ...errors import PlanError
from ...plan.mixed import members


def used_groups(doc) -> list:
    """The groups with a share, each checked to be data-parallel only (what this emitter splits)."""
    out = []
    for g in members(doc):
        b, n = g["batch_share"], g["devices"]
        if not b:
            continue
        par = dict(g.get("parallel") or {"dp": n, "tp": 1, "pp": 1})
        inner = ((g.get("plan") or {}).get("parallel") or {})
        for key in ("tp", "pp", "cp", "ep"):         # the group's own plan is what a rank would emit
            par[key] = max(int(par.get(key, 1) or 1), int(inner.get(key, 1) or 1))
        if par["tp"] != 1 or par["pp"] != 1 or par["cp"] != 1 or par["ep"] != 1 or par.get("dp") != n:
            lay = " ".join(f"{k}={par[k]}" for k in ("tp", "pp", "cp", "ep") if par[k] != 1)
            raise PlanError(f"group {g['name']} runs {lay or 'dp=' + str(par.get('dp'))}: uneven shares are emitted "
                            f"for data-parallel groups only; pin tp=1 pp=1 or run the group's plan alone")
        if b % n:
            raise PlanError(f"group {g['name']}: share {b} does not split over its {n} devices; re-run the search")
        priced = ((g.get("plan") or {}).get("model") or {}).get("global_batch")
        if priced is not None and priced != b:     # trained as priced, or not at all
            raise PlanError(f"group {g['name']}: batch_share {b} is not the batch its plan was priced at "
                            f"({str(priced)[:40]}); re-run the search for these shares")
        out.append(g)
    if sum(g["batch_share"] for g in out) != doc["model"]["global_batch"]:
        raise PlanError("mixed-cluster plan: the shares do not add up to the global batch")
    return out


def rank_slices(doc) -> list:
    """[(start, stop)] of the global batch for every rank: groups with a share in the plan's order,
    each group's share split evenly over its data-parallel ranks (its devices, in this emitter)."""
    out, start = [], 0
    for g in used_groups(doc):
        b, n = g["batch_share"], g["devices"]
        for _ in range(n):
            out.append((start, start + b // n))
            start += b // n
    return out


def loss_scale(rows: int, world: int, global_batch: int) -> float:
    """The factor on a rank's mean loss over `rows` samples that turns the ranks' mean into the
    weighted sum: world x rows / global batch."""
    return world * rows / global_batch


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
