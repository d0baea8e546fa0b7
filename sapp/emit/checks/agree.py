"""One answer for all ranks: a per-rank check refused on every rank if any rank refuses."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ...errors import PlanError


def agree(check, world: int, device) -> None:
    """Run a per-rank check and refuse on every rank if any rank refuses: a pipeline rank compares
    only its own stages, and one rank raising while the others go on into the first step's
    collectives would leave them waiting on it until the process group's timeout."""
    try:
        check()
        err = None
    except PlanError as e:
        err = e
    if world > 1 and dist.is_initialized():
        flag = torch.tensor([0.0 if err is None else 1.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if err is None and flag.item() > 0:
            raise PlanError("another rank refused the plan before the first step (its message says why); "
                            "this rank stopped with it")
    if err is not None:
        raise err
