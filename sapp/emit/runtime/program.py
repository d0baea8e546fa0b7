"""Program: one rank's training program, as sapp/emit/recipe.py builds it.  `Program.step` takes THIS
rank's data-parallel shard (see `Program.shard`) and returns the global mean loss on every rank."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch.nn import functional as F

from ...errors import PlanError
from ...models.data import logits_of
from ..checks import manifest as manifest_mod


def default_loss(out, target):
    out = logits_of(out)
    if not target.is_floating_point():
        return F.cross_entropy(_wide(out.reshape(-1, out.shape[-1])), target.reshape(-1))
    return F.mse_loss(_wide(out.reshape(target.shape)), target)


def _wide(t):
    """`t` in at least float32: half-precision logits widen for the loss; a float64 model's stay."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _resolve_loss(model, loss_fn):
    if loss_fn is not None:
        return lambda out, target: loss_fn(logits_of(out), target)
    try:
        import sapp.models as models  # not `from .. import`: sapp.__getattr__ recurses on it
        fn = models.loss_fn(model)
        return lambda out, target: fn(logits_of(out), target)
    except Exception:  # the zoo may not know this model (HF, user models): cross-entropy / MSE
        return default_loss


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


@dataclass(eq=False, repr=False, kw_only=True)
class Program:
    """One rank's training program (made by sapp/emit/recipe.py; compared by identity).  `parameters`,
    `module` and `dp_rank` are read off the fields below."""
    # ---- who and where -------------------------------------------------------------------------
    plan: object
    rank: int
    world: int
    device: torch.device
    coords: tuple                  # (pp_i, dp_i, tp_i)
    pp: int
    dp: int                        # the gradient group (dp x cp under context parallelism)
    tp: int
    ep: int
    mesh: object                   # DeviceMesh (pp, dp, tp); None in one process
    # ---- what runs -----------------------------------------------------------------------------
    modules: list                  # this rank's model or stage modules, wrapped
    stage_indices: list
    optimizers: list
    grad_hooks: list               # called after backward, before the optimizers
    schedule: object               # the pipeline schedule (None: no pipeline)
    loss_fn: Callable
    micro_batches: int
    zero: int                      # the ZeRO stage that runs
    autocast: Callable             # () -> the context the forward runs in
    precision: str                 # what runs
    plan_precision: str            # what was priced
    first_stage: bool
    last_stage: bool
    fused_params: dict             # permuted parameters: {name: (axis, sizes, tp)}
    recomputed: list               # region names checkpointed
    recompute_done: dict           # block -> what recomputation applied
    notes: list                    # what the emitter decided beyond the plan
    # ---- what the manifest needs of the whole model (a pipeline rank holds only its stages) -----
    block_list: list
    recompute_modes: dict
    stage_block_list: list
    full_modules: dict             # name -> module type
    full_model: object             # the model (None under a pipeline)
    allow_mismatch: bool
    runtime_checked: bool          # False until a forward ran where selective recomputation needs one
    # ---- set by the manifest (sapp/emit/checks/manifest.py) -------------------------------------
    mismatches: list = field(default_factory=list)         # allowed differences from the plan
    repriced: dict | None = None   # sapp.evaluate of what runs, when it differs and that was allowed
    reprice: Callable | None = None          # what prices it, from emit's caller
    manifest_expected: dict | None = None
    manifest: dict | None = None   # what runs
    recompute_unpriced: dict = field(default_factory=dict)

    # ---- data --------------------------------------------------------------------------------
    @property
    def dp_rank(self) -> int:
        return self.coords[1]

    def shard(self, *tensors):
        """This rank's data-parallel slice of global-batch tensors (dp rank i takes rows
        [i*B/dp, (i+1)*B/dp), like MindSpore's num_shards/shard_id)."""
        out = []
        for t in tensors:
            if isinstance(t, (tuple, list)):
                out.append(type(t)(self.shard(*t)) if len(t) != 1 else (self.shard(t[0]),))
                continue
            b, d = t.shape[0], self.data_ranks
            if b % d:
                raise PlanError(f"global batch {b} does not divide over dp={d}; use a multiple of {d}")
            n = b // d
            out.append(self._local(t[self.dp_rank * n:(self.dp_rank + 1) * n]))
        return out[0] if len(out) == 1 else tuple(out)

    @property
    def data_ranks(self) -> int:
        """Ranks the global batch's rows are split over (context parallelism splits tokens instead)."""
        return self.dp

    def _local(self, rows):
        """This rank's part of its rows (all of them; sapp/emit/cp/cp.py keeps its tokens)."""
        return rows

    @property
    def module(self):
        return self.modules[0]

    # ---- training ----------------------------------------------------------------------------
    def step(self, inputs, targets) -> float:
        """One optimizer step on this rank's shard; returns the global-batch mean loss (all ranks)."""
        inputs = tuple(x.to(self.device) for x in _tuple(inputs))
        targets = targets.to(self.device) if torch.is_tensor(targets) else targets
        if self.schedule is not None:
            local = self._pipeline_step(inputs, targets)
        else:
            local = self._accumulate(inputs, targets)
        if not self.runtime_checked:
            # the recomputed operators are known once a forward ran: compare them with the plan now
            self.runtime_checked = True
            manifest_mod.check(self, runtime=True)
        for hook in self.grad_hooks:
            hook()
        for opt in self.optimizers:
            opt.step()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        return self._global_loss(local)

    def _accumulate(self, inputs, targets):
        """Forward + backward of this rank's batch as the plan's micro-batches (gradient accumulation
        when pp = 1 and micro_batches > 1): the mean of equal chunks' mean losses is the batch's mean
        loss, so the gradients equal one full-batch pass.  Gradient sync runs on the last chunk only."""
        n = self.micro_batches if self.micro_batches and self.micro_batches > 1 else 1
        module = self.modules[0]
        if n > 1 and (not torch.is_tensor(targets) or inputs[0].shape[0] % n):
            raise PlanError(f"local batch {inputs[0].shape[0]} does not split into {n} micro-batches; use a "
                            f"global batch divisible by dp x micro_batches")
        chunks = list(zip(*(x.chunk(n) for x in inputs), targets.chunk(n))) if n > 1 else [(*inputs, targets)]
        total = None
        for i, (*xs, y) in enumerate(chunks):
            last = i == n - 1
            if hasattr(module, "set_requires_gradient_sync"):        # FSDP2
                module.set_requires_gradient_sync(last)
            sync = module.no_sync() if (not last and hasattr(module, "no_sync")) else contextlib.nullcontext()
            with sync:
                with self.autocast():
                    loss = self.loss_fn(module(*xs), y)
                (loss / n if n > 1 else loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        return total / n if n > 1 else total

    def _pipeline_step(self, inputs, targets):
        n = self.micro_batches
        if inputs[0].shape[0] % n:
            raise PlanError(f"local batch {inputs[0].shape[0]} does not split into {n} micro-batches; "
                            f"use a global batch divisible by dp x micro_batches")
        kw = {}
        # contiguous: the stage was traced with contiguous examples, and torch's pipelining (2.11)
        # refuses a micro-batch whose strides differ (ids sliced off a longer row: stride (17, 1))
        args = tuple(x.contiguous() if torch.is_tensor(x) else x for x in inputs) if self.first_stage else ()
        losses = []
        if self.last_stage:
            kw = {"target": targets, "losses": losses}
        self.schedule.step(*args, **kw)
        if self.last_stage:
            return torch.stack([_wide(l.detach()) for l in losses]).mean()
        return None

    def _global_loss(self, local) -> float:
        if self.world == 1:
            return float(local)
        # only one rank per data-parallel replica contributes: the last stage's tp rank 0
        # every rank reduces in one dtype: float32, or float64 for a float64 model (its loss kept whole)
        wide = torch.promote_types(self._param_dtype(), torch.float32)
        contrib = local.to(wide) / self.dp if (local is not None and self.last_stage and self.coords[2] == 0) else None
        buf = torch.zeros((), device=self.device, dtype=wide) if contrib is None else contrib.reshape(())
        if hasattr(buf, "full_tensor"):
            buf = buf.full_tensor()
        buf = buf.clone()
        dist.all_reduce(buf)
        return float(buf)

    def _param_dtype(self):
        """The widest floating dtype of this rank's parameters (float32 if it holds none)."""
        out = torch.float32
        for p in self.parameters:
            if p.is_floating_point():
                out = torch.promote_types(out, p.dtype)
        return out

    @property
    def parameters(self) -> list:
        seen, out = set(), []
        for m in self.modules:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out
