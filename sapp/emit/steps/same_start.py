"""Step: every rank starts from rank 0's weights.

emit() expects the model identically initialised on every rank, and torch.manual_seed makes that so
for initialisers that draw from torch's generator.  Model code nobody here wrote may draw from another:
hyper-connections (tab-transformer-pytorch's FT-Transformer and TabTransformer) picks each layer's
initial residual stream with Python's `random.randrange`, so every rank built a different
`static_alpha` and data parallelism trained replicas that never agreed, silently.  DDP broadcasts
rank 0's state when it wraps a module; the other wrappers here (the all-reduce after backward, FSDP2,
DTensor sharding, pipeline stages) shard or keep what each rank holds.  So before anything is split,
every parameter and buffer of the whole model is broadcast from global rank 0, and a note says so
when some rank's copy differed."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..build import Rank


def apply(model, rank: Rank, notes: list) -> None:
    """Reads the whole `model` (before any split) and `rank` (world, device); writes the model's
    parameters and buffers in place, and a note to `notes` when some rank's copy differed."""
    if rank.world == 1 or not dist.is_initialized():
        return
    changed = 0
    with torch.no_grad():
        for t in _state(model):
            # through the collective's device (NCCL holds no CPU tensors); the model's own copy kept
            wire = t.detach().to(rank.device, torch.uint8 if t.dtype == torch.bool else t.dtype, copy=True)
            dist.broadcast(wire, src=0)
            got = wire.to(t.device, t.dtype)
            if not torch.equal(got, t.detach()):
                changed += 1
                t.copy_(got)
    flag = torch.tensor([float(changed)], device=rank.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() > 0:
        notes.append("the ranks built different initial weights (the model's __init__ draws from a generator "
                       "other than torch's, e.g. Python's random): every rank starts from rank 0's")


def _state(model):
    """Parameters and floating or integer buffers, each tensor once (tied weights share one)."""
    seen = set()
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen and not t.is_meta:
            seen.add(id(t))
            yield t
