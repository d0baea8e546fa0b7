"""ZeRO-1: optimizer states sharded evenly over the data-parallel group, element by element.

Why not torch's ZeroRedundancyOptimizer: it cannot hold DTensors (so ZeRO-1 with tp > 1 used to run as
FSDP's ZeRO-2), and it partitions whole parameter tensors, so a model with a few large tensors puts
most of the state on one rank (mlp-tiny dp2 x pp2: 16 KB of Adam state on one rank, none on the
other) while the cost model prices states / dp on every rank.

Here the (local shards of the) parameters are laid end to end as one virtual vector of N elements; dp
rank r owns elements [r*N/dp, (r+1)*N/dp).  Its optimizer runs on plain nn.Parameter views of the
owned pieces (same storage as the parameters), with the matching slices of the gradients, which the
data-parallel all-reduce has already averaged; after the step every piece is broadcast from its owner
in place.  Gradients are synchronised as for ZeRO-0 (GradAllReduce or DDP)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..tp.dtensor_local import local_grad


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def pieces(sizes, dp: int) -> list:
    """[(tensor index, start, end, owner)] splitting tensors of `sizes` elements, laid end to end,
    into dp equal ranges (the last ranks may own one element less)."""
    total = sum(sizes)
    bounds = [total * i // dp for i in range(dp + 1)]
    out, off = [], 0
    for i, n in enumerate(sizes):
        for o in range(dp):
            a, b = max(off, bounds[o]), min(off + n, bounds[o + 1])
            if a < b:
                out.append((i, a - off, b - off, o))
        off += n
    return out


class LocalShardZero1:
    """optimizer-like: step() / zero_grad() / state_dict() over this rank's share of `params`."""

    zero_stage = 1

    def __init__(self, params, optimizer_class, dp_group, **kw):
        self.params = [p for p in params if p.requires_grad]
        self.group = dp_group
        dp, me = dist.get_world_size(dp_group), dist.get_rank(dp_group)
        flat = [_local(p).detach().view(-1) for p in self.params]     # views: parameters are contiguous
        self.pieces = pieces([f.numel() for f in flat], dp)
        self.src = [dist.get_global_rank(dp_group, o) for o in range(dp)]
        self.mine = [(i, a, b) for i, a, b, o in self.pieces if o == me]
        self.aliases = [nn.Parameter(flat[i][a:b], requires_grad=True) for i, a, b in self.mine]
        self.optim = optimizer_class(self.aliases, **kw) if self.aliases else None
        self.optimizer_class, self.steps = optimizer_class, 0

    @property
    def state(self):
        return self.optim.state if self.optim is not None else {}

    @torch.no_grad()
    def step(self):
        for alias, (i, a, b) in zip(self.aliases, self.mine):
            g = local_grad(self.params[i])          # the gradient's elements in the parameter's layout
            alias.grad = None if g is None else g.reshape(-1)[a:b]
        if self.optim is not None:
            self.optim.step()
        self.steps += 1
        for alias in self.aliases:
            alias.grad = None
        for i, a, b, o in self.pieces:       # the same order on every rank
            dist.broadcast(_local(self.params[i]).detach().view(-1)[a:b], src=self.src[o], group=self.group)

    def zero_grad(self, set_to_none: bool = True):
        for p in self.params:
            p.grad = None

    def state_dict(self):
        return self.optim.state_dict() if self.optim is not None else {}

    def load_state_dict(self, sd):
        if self.optim is not None:
            self.optim.load_state_dict(sd)

    # Checkpoints name optimizer state per parameter (sapp/emit/runtime/train_state.py), so that a checkpoint
    # written under one plan loads under any other: the shards are gathered to whole per-parameter
    # tensors on save and sliced back on load.  Collective over the dp group: every rank calls these
    # for the same parameters in the same order.
    def state_keys(self) -> tuple:
        return ("step", "exp_avg", "exp_avg_sq") if self.optimizer_class in (torch.optim.Adam, torch.optim.AdamW) else ()

    @torch.no_grad()
    def full_state(self, i: int) -> dict:
        """{key: whole state of parameter i} ({} before the first step); a DTensor parameter's state is
        a DTensor with its placements, so DCP reshards it over tp too."""
        keys = [k for k in self.state_keys() if k != "step"]
        if not self.steps or not keys:
            return {}
        p = self.params[i]
        local = _local(p)
        full = {k: torch.zeros_like(local) for k in keys}
        mine = {(j, a, b): alias for alias, (j, a, b) in zip(self.aliases, self.mine)}
        for j, a, b, o in self.pieces:
            if j != i:
                continue
            alias = mine.get((j, a, b))
            for k in keys:
                buf = full[k].view(-1)[a:b]
                if alias is not None:
                    buf.copy_(self.optim.state[alias][k])
                dist.broadcast(buf, src=self.src[o], group=self.group)
        if hasattr(p, "to_local"):
            from torch.distributed.tensor import DTensor
            full = {k: DTensor.from_local(v, p.device_mesh, p.placements, run_check=False) for k, v in full.items()}
        full["step"] = torch.tensor(float(self.steps), dtype=torch.float64)
        return full

    @torch.no_grad()
    def load_full_state(self, i: int, st: dict) -> None:
        """Take this rank's pieces of parameter i's whole state `st` (as full_state returns it)."""
        from torch.optim.optimizer import _get_scalar_dtype
        self.steps = int(float(st["step"]))
        for alias, (j, a, b) in zip(self.aliases, self.mine):
            if j != i:
                continue
            g = self.optim.param_groups[0]
            fused = bool(g.get("fused")) or bool(g.get("capturable"))
            step = (torch.tensor(float(self.steps), dtype=_get_scalar_dtype(is_fused=g.get("fused")), device=alias.device)
                    if fused else torch.tensor(float(self.steps), dtype=_get_scalar_dtype()))
            self.optim.state[alias] = {"step": step, **{k: _local(st[k]).reshape(-1)[a:b].clone().to(alias.dtype)
                                                        for k in self.state_keys() if k != "step"}}


def make(params, kind: str, lr: float, dp_group) -> LocalShardZero1:
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}.get(kind)
    if cls is None:
        from ...errors import PlanError
        raise PlanError(f"optimizer {kind!r} is not supported; use adam, adamw or sgd")
    kw = {"lr": lr}
    if kind != "sgd":
        kw["fused"] = True       # one pass over p, g, m, v: the 28 B per parameter the model prices
    return LocalShardZero1(params, cls, dp_group, **kw)
