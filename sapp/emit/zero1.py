"""ZeRO-1 (optimizer states sharded over the data-parallel group) for tensor-parallel modules.

torch's ZeroRedundancyOptimizer cannot hold DTensors, so ZeRO-1 with tp > 1 used to run as FSDP2
ZeRO-2 -- a plan priced one way and run another.  Here every parameter's LOCAL shard gets a plain
nn.Parameter alias (same storage), ZeroRedundancyOptimizer shards those over the dp group, and its
post-step broadcast writes the updated values straight into the DTensors' local tensors.  Gradients
are synchronised over dp before the step (GradAllReduce), as for ZeRO-0."""
from __future__ import annotations

import torch
from torch import nn


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


class LocalShardZero1:
    """optimizer-like: step() / zero_grad() over the local shards of `params`."""

    zero_stage = 1

    def __init__(self, params, optimizer_class, dp_group, **kw):
        from torch.distributed.optim import ZeroRedundancyOptimizer
        self.params = [p for p in params if p.requires_grad]
        with torch.no_grad():
            self.aliases = [nn.Parameter(_local(p).detach(), requires_grad=True) for p in self.params]
        for a, p in zip(self.aliases, self.params):
            assert a.data_ptr() == _local(p).data_ptr(), "alias must share the shard's storage"
        self.optim = ZeroRedundancyOptimizer(self.aliases, optimizer_class=optimizer_class, process_group=dp_group, **kw)

    @property
    def state(self):
        return self.optim.optim.state

    def step(self):
        for a, p in zip(self.aliases, self.params):
            a.grad = None if p.grad is None else _local(p.grad)
        self.optim.step()
        for a in self.aliases:
            a.grad = None

    def zero_grad(self, set_to_none: bool = True):
        for p in self.params:
            p.grad = None
        for a in self.aliases:
            a.grad = None


def make(params, kind: str, lr: float, dp_group) -> LocalShardZero1:
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}.get(kind)
    if cls is None:
        from ..errors import PlanError
        raise PlanError(f"optimizer {kind!r} is not supported; use adam, adamw or sgd")
    return LocalShardZero1(params, cls, dp_group, lr=lr)
