"""emit(model, plan) -> Program: this rank's part of the training program a plan describes.

Build order per rank: checks -> mesh -> (pipeline split, private stage copies) -> recompute ->
tensor parallel -> host placement -> DDP / FSDP2 -> optimizers -> pipeline schedule.  `Program.step`
takes THIS rank's data-parallel shard (see `Program.shard`) and returns the global mean loss on every
rank."""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from ...capture.blocks import container_children
from ...errors import PlanError
from ...models.data import logits_of
from ..checks import plan as checks, manifest as manifest_mod
from ..ep import experts as ep_mod
from ..tp import parallel, sp as sp_mod
from ..pp import pipe as pipe_mod
from ..recompute import checkpointing as recompute
from ..dp import zero1
from ..host import sparse as sparse_mod
from .dist import default_device, rank_world


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


class Program:
    """One rank's training program.  Attributes: plan, rank, world, device, coords (pp_i, dp_i, tp_i),
    dp/tp/pp, modules (this rank's model or stage modules, wrapped), parameters, optimizers, mesh,
    notes (what the emitter decided beyond the plan), recomputed (module names checkpointed),
    manifest (what runs: sapp/emit/checks/manifest.py), mismatches (allowed differences from the plan),
    repriced (sapp.evaluate of what runs, when it differs and that was allowed)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

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


class _HostSync:
    """After backward: average host tables' sparse gradients over the dp group (they are kept out of
    DDP/FSDP, which cannot bucket CPU sparse gradients next to device ones)."""

    def __init__(self, module, section, group):
        self.module, self.section, self.group = module, section, group

    def __call__(self):
        from ..host import host
        host.sync_host_grads(self.module, self.section, group=self.group)


def _example_inputs(model, plan, example_inputs, mbs, device):
    if example_inputs is not None:
        return _tuple(example_inputs)
    try:
        import sapp.models as models  # not `from .. import`: sapp.__getattr__ recurses on it
        return _tuple(models.example_inputs(model, mbs, device))
    except Exception as e:
        raise PlanError("pipeline and tensor-parallel plans need example inputs to trace the model; pass emit(..., example_inputs=...) "
                        f"(the model zoo could not make them: {type(e).__name__})") from None


def _autocast_stage(mod: nn.Module, device, dtype=torch.bfloat16) -> None:
    """A pipeline stage's forward in bf16 (fp16) autocast, its floating outputs back in fp32."""
    inner = mod.forward

    def forward(*args, **kwargs):
        with torch.autocast(device.type, dtype=dtype):
            out = inner(*args, **kwargs)
        if isinstance(out, (tuple, list)):
            return type(out)(o.float() if torch.is_tensor(o) and o.is_floating_point() else o for o in out)
        return out.float() if torch.is_tensor(out) and out.is_floating_point() else out

    mod.forward = forward


def plan_precision(plan) -> str:
    """The training precision the plan was priced for; a plan that names none (hand-written) trains
    in fp32."""
    prec = (plan._d.get("settings") or {}).get("precision", "fp32")
    if prec not in ("bf16-mixed", "fp16-mixed", "fp32"):
        raise PlanError(f"plan settings.precision {prec!r} is not supported; use 'bf16-mixed', 'fp16-mixed' or 'fp32'")
    return prec


def _offload_overlap(mod, plan, dp, pp, blocks, hooks):
    """OffloadAdam's overlap as priced (sapp/placement/cost.py: per-group CPU Adam during the last
    backward) where gradients are final when backward accumulates them: no data-parallel sync (dp = 1).
    Pipeline-tied weights wait for their cross-stage sum (late); the schedule's 1/m scaling of the
    device gradients is applied on the host (grad_divisor).  None (step after backward) with dp > 1."""
    if dp > 1:
        return None
    m = int(plan.pipeline.get("micro_batches", 1) or 1)
    tied = {id(p) for h in hooks if isinstance(h, pipe_mod.TiedGrads) for ps, _ in h.ties for p in ps}
    late = [n for n, p in mod.named_parameters() if id(p) in tied]
    return {"accumulations": m, "blocks": blocks, "late": late, "grad_divisor": m if pp > 1 else 1}


# set a sharded region's stored head counts / widths to the rank's share (off only in tests that
# show what the shape audit catches without it)
LOCALISE = True


def emit(model: nn.Module, plan, *, loss_fn=None, rank=None, world=None, device=None, lr: float = 1e-3,
         optimizer: str = "adam", example_inputs=None, name: str = "", check_fingerprint: bool = True,
         grad_sync: str = "auto", allow_mismatch: bool = False) -> Program:
    """Turn `plan` into this rank's training program for `model` (identically initialised on every
    rank, e.g. built after the same torch.manual_seed).  The process group must be initialised when the
    plan has more than one device (sapp.emit.runtime.dist.init() does it from the torchrun environment).

    loss_fn(logits, targets): the loss, called on `logits_of(model output)` (an HF output's .logits),
    as capture calls it (sapp.models.WithLoss): one contract for search and training.
    example_inputs: one batch of model inputs (any batch size); needed to trace pipeline plans and to
    fingerprint non-zoo models.  check_fingerprint=False skips the capture-based model check (the
    parameter-count and zoo-name checks still run), e.g. when a launcher already did it.
    grad_sync (data parallelism without ZeRO-2/3): "auto" = DDP on CUDA, one flat all-reduce after
    backward on CPU; "ddp" or "allreduce" force one.
    allow_mismatch: where what runs differs from the plan (see sapp/emit/checks/manifest.py), keep going with
    a loud note and a re-priced prediction instead of raising PlanError."""
    if grad_sync not in ("auto", "ddp", "allreduce"):
        raise PlanError(f"grad_sync must be 'auto', 'ddp' or 'allreduce', got {grad_sync!r}")
    plan = checks.as_plan(plan)
    rank, world = rank_world(rank, world)
    checks.check_all(model, plan, world, name, _tuple(example_inputs) if example_inputs is not None else None,
                     fingerprint=check_fingerprint)
    par = plan.parallel
    if par["tp"] > 1 and checks.tp_groups(plan):
        # before any collective: local head counts set, then every op's shape at one rank's layer
        # shapes checked against the plan's split (sapp/emit/checks/shape_audit.py)
        from ..checks import shape_audit
        ex = _example_inputs(model, plan, example_inputs, 2, "cpu")
        audit_notes, partial = [], []
        shape_audit.check(model, checks.tp_modules(plan), checks.tp_groups(plan), par["tp"], ex, audit_notes,
                          fix=LOCALISE, partial=partial, sp_sec=sp_mod.section(plan) if par["pp"] == 1 else None)
    else:
        audit_notes, partial = [], []
    if world > 1 and not dist.is_initialized():
        raise PlanError("the plan needs several processes but torch.distributed is not initialised; launch with "
                        "`sapp run` / torchrun and call sapp.emit.runtime.dist.init() first")
    device = torch.device(device) if device is not None else default_device()
    pp, dp, tp = par["pp"], par["dp"], par["tp"]
    cp = par.get("cp", 1)
    if cp > 1:
        # context parallelism (sapp/emit/cp/cp.py): parameters are replicated over dp x cp, so from here
        # on "dp" is that gradient group; the data shard and the attention know the split
        from ..cp import cp as cp_mod
        cp_mod.check_plan(plan)
        dp = dp * cp
    me = parallel.coords(rank, pp, dp, tp)
    mesh = parallel.build_mesh(device, pp, dp, tp) if world > 1 else None
    notes = audit_notes
    loss = _resolve_loss(model, loss_fn)
    modes = recompute.plan_modes(plan.recompute, model)
    blocks = recompute.block_names(model)
    try:
        regions = recompute.priced_regions(model, modes, _tuple(example_inputs) if example_inputs is not None else None)
    except PlanError:
        if not allow_mismatch:
            raise
        regions = {b: None for b, m in modes.items() if m == "selective"}
    run_modes = dict(modes)
    for b, reg in regions.items():
        if reg is None and allow_mismatch:      # strict: recompute.apply refuses the block
            del run_modes[b]
    tp_styles = checks.tp_modules(plan)
    if tp > 1 and not tp_styles:
        notes.append(f"plan has tp={tp} but names no tp_modules: every tensor-parallel rank runs the whole model replicated")
    zero = plan.zero
    # bf16-mixed as priced: fp32 weights, bf16 compute (autocast) and bf16 gradient communication.
    # Pipeline stages run their forward under autocast themselves and hand fp32 activations to the
    # next stage (a stage's boundary dtype is fixed when it is built).
    # fp16-mixed (GPUs without bf16, e.g. V100): the same with fp16 autocast; loss scaling is not emitted
    prec = plan_precision(plan)
    mixed = prec in ("bf16-mixed", "fp16-mixed")
    half = torch.float16 if prec == "fp16-mixed" else torch.bfloat16
    autocast = ((lambda: torch.autocast(device.type, dtype=half)) if mixed else contextlib.nullcontext)
    placement = plan.placement or {}
    host_groups = bool((placement.get("groups") or {}))

    sched_kind = plan.pipeline.get("schedule", "none") if pp > 1 else "none"
    n_stages = checks.stage_count(plan) if pp > 1 else 1
    if cp > 1:
        # before any pipeline trace: traced stages then run the cp attention (its K/V exchange is a
        # custom operator export keeps) at this rank's token count and global positions
        cp_mod.apply(model, cp_mod.cp_group(rank, pp, dp // cp, cp, tp), cp, me[1] % cp)
    if pp > 1:
        n_micro = plan.pipeline["micro_batches"]
        gb = plan.model.get("global_batch")
        mbs = plan.pipeline.get("micro_batch_size") or (gb // ((dp // cp) * n_micro) if gb else None)
        if not mbs:
            raise PlanError("pipeline plans need pipeline.micro_batch_size or model.global_batch")
        ex = pipe_mod.micro_example(tuple(x.to("cpu") for x in _example_inputs(model, plan, example_inputs, mbs, "cpu")), mbs)
        if cp > 1:          # the stage graphs are traced at this rank's share of the sequence
            ex = tuple(cp_mod.shard_sequence(x, cp, me[1] % cp) if x.dim() >= 2 else x for x in ex)
        local = parallel.local_layers(model, tp_styles, tp, checks.tp_groups(plan)) if tp > 1 else None
        traced = pipe_mod.trace(model, ex, checks.split_points(plan), local=local)
        mine = [s for s in range(n_stages) if s % pp == me[0]]
        raw = pipe_mod.stage_modules(traced, mine)
        if int(par.get("ep", 1) or 1) > 1:      # the stage's MoE layers eager again, for EP (emit/ep.py)
            ep_mod.eager_moe(raw, model)
    else:
        traced, mine, raw = None, [0], {0: model}

    wrapped, hooks, optimizers, recomputed, eff_zero = {}, [], [], {}, zero
    # ZeRO-1: gradients synchronised like ZeRO-0, optimizer states sharded evenly, element by element,
    # over the dp group (sapp/emit/dp/zero1.py) -- under TP not FSDP's ZeRO-2, with host placement not a
    # full optimizer per rank, and never whole tensors per rank (ZeroRedundancyOptimizer)
    local_zero1 = zero == 1 and dp > 1
    ep = ep_mod.check(plan, model)
    ep_groups = ep_mod.groups(pp, dp, tp, ep, rank) if ep > 1 else None
    expert_params, sparse_names = {}, {}
    if mixed and traced is not None:
        for mod in raw.values():
            _autocast_stage(mod, device, half)
    for s, mod in raw.items():
        if host_groups:
            from ..host import host      # engineer H4's host placement: host tables stay on the CPU
            host.apply_placement(mod, placement, device)
        else:
            mod.to(device)
        recomputed.update(recompute.apply(mod, run_modes, regions))
        if tp > 1 and tp_styles:
            parallel.apply_tp(mod, tp_styles, mesh["tp"], notes,
                              originals=dict(model.named_modules()) if traced is not None else None,
                              groups=checks.tp_groups(plan), sp_sec=sp_mod.section(plan))
        host_names = ()
        if host_groups and dp > 1:
            from ..host import host
            host_names = tuple(host.ignore_host_params_in_ddp(mod, placement))
            if host_names:
                hooks.append(_HostSync(mod, placement, parallel.gloo_dp_group(mesh, device, pp, dp, tp)))
        sparse_names[s] = sparse_mod.table_names(mod)
        if sparse_names[s] and dp > 1:     # device sparse tables: outside DDP/FSDP, rows all-gathered
            named = dict(mod.named_parameters())
            hooks.append(sparse_mod.SparseGradSync([named[n] for n in sparse_names[s]], mesh["dp"].get_group()))
            host_names = tuple(host_names) + tuple(sparse_names[s])
        if ep > 1:      # experts spread over EP groups: kept out of the dp sync, synced over expert-DP
            expert_names = ep_mod.apply(mod, ep, ep_groups[0], ep_groups[2])
            host_names = tuple(host_names) + tuple(expert_names)
            named = dict(mod.named_parameters())
            expert_params[s] = [named[n] for n in expert_names]
            hooks.append(ep_mod.ExpertGradSync(expert_params[s], ep_groups[1], dp, dp // ep))
        w, hook, eff_zero = parallel.wrap_dp(mod, dp=dp, tp=tp, zero=0 if local_zero1 else zero, mesh=mesh, blocks=blocks,
                                             device=device, notes=notes, staged=traced is not None,
                                             host_names=host_names, mixed=mixed,
                                             grad_sync="allreduce" if ep > 1 else grad_sync)
        wrapped[s] = w
        if hook:
            hooks.append(hook)
    if partial:
        # replicated weights applied to this rank's heads only: their gradients summed over tp
        names = set(partial)
        ids = {id(p) for n, p in model.named_parameters() if n in names}
        mine_p = [p for mod in raw.values() for p in mod.parameters() if id(p) in ids]
        if mine_p:
            hooks.insert(0, parallel.TPPartialGrads(mine_p, mesh["tp"].get_group()))
            notes.append(f"tp: {len(mine_p)} replicated parameter(s) applied to this rank's share of a split "
                         f"axis (e.g. {sorted(partial)[0]}): gradients summed over the tp group")
    if traced is not None:
        tied = pipe_mod.TiedGrads(model, traced, n_stages, raw, pp, dp, tp)
        if tied.ties:
            hooks.append(tied)
            notes.append(f"{len(tied.ties)} tied parameter(s) shared across pipeline stages: gradients summed between stages")
    for s, mod in raw.items():
        sparse_ids = {id(p) for n, p in mod.named_parameters() if n in set(sparse_names[s])}
        if host_groups:
            from ..host import host
            opts = list(host.build_optimizers(mod, placement, lr, optimizer=optimizer,
                                              overrides={n: "sparse_adam" for n in sparse_names[s]},
                                              overlap=_offload_overlap(mod, plan, dp, pp, blocks, hooks)))
            if local_zero1:     # the device part's optimizer states sharded over dp, as priced
                dense = [p for o in opts if o.sapp_where == "device" and o.sapp_kind != "sparse_adam"
                         for g in o.param_groups for p in g["params"]]
                opts = [o for o in opts if o.sapp_where != "device" or o.sapp_kind == "sparse_adam"]
                if dense:
                    z1 = zero1.make(dense, optimizer, lr, mesh["dp"].get_group())
                    z1.sapp_where = "device"
                    opts.append(z1)
                eff_zero = 1
            optimizers += opts
            continue
        # sparse tables: SparseAdam, whole on every rank (priced so at any ZeRO stage); the rest below
        if sparse_ids:
            optimizers.append(sparse_mod.optimizer([p for p in mod.parameters() if id(p) in sparse_ids], lr))
        dense_params = [p for p in mod.parameters() if id(p) not in sparse_ids]
        if local_zero1 and expert_params.get(s):
            # ZeRO-1 over expert-DP for the experts (as priced), over dp for the rest
            eff_zero = 1
            ex = {id(p) for p in expert_params[s]}
            optimizers.append(zero1.make([p for p in dense_params if id(p) not in ex], optimizer, lr,
                                         mesh["dp"].get_group()))
            optimizers.append(zero1.make(expert_params[s], optimizer, lr, ep_groups[1]))
        elif local_zero1:
            eff_zero = 1
            optimizers.append(zero1.make(dense_params, optimizer, lr, mesh["dp"].get_group()))
        else:
            dp_group = mesh["dp"].get_group() if (dp > 1 and eff_zero == 1) else None
            optimizers.append(parallel.make_optimizer(dense_params, optimizer, lr, zero=eff_zero, dp_group=dp_group))

    schedule = None
    if traced is not None:
        if plan.pipeline.get("scatter_gather") and tp > 1:     # Megatron's boundary scatter/gather (priced)
            for s in mine:
                pipe_mod.scatter_gather(wrapped[s], s, n_stages, mesh["tp"])
        stages = [pipe_mod.pipeline_stage(wrapped[s], s, n_stages, device, mesh["pp"].get_group()) for s in mine]
        schedule = pipe_mod.build_schedule(sched_kind, stages, plan.pipeline["micro_batches"], loss)
    extra = {"cp": cp, "dp_only": dp // cp, "cp_rank": me[1] % cp} if cp > 1 else {}
    prog = (cp_mod.CPProgram if cp > 1 else Program)(**extra, plan=plan, rank=rank, world=world, device=device, coords=me, pp=pp, dp=dp, tp=tp, ep=ep,
                   mesh=mesh, modules=[wrapped[s] for s in mine], stage_indices=mine, optimizers=optimizers,
                   grad_hooks=hooks, schedule=schedule, loss_fn=loss, notes=notes, recomputed=sorted(
                       d["region"] for d in recomputed.values() if d["region"]), recompute_done=recomputed,
                   micro_batches=plan.pipeline.get("micro_batches", 1), zero=eff_zero, autocast=autocast,
                   # what runs (autocast's dtype) vs what was priced
                   precision=("fp32" if not mixed else "fp16-mixed" if half == torch.float16 else "bf16-mixed"),
                   plan_precision=plan_precision(plan),
                   first_stage=0 in mine, last_stage=(n_stages - 1) in mine,
                   # what the manifest needs of the whole model (a pipeline rank holds only its stages)
                   block_list=blocks, recompute_modes=modes, stage_block_list=sorted(container_children(model)), full_modules={n: type(m) for n, m in model.named_modules()},
                   full_model=model if traced is None else None, allow_mismatch=allow_mismatch, mismatches=[],
                   repriced=None, runtime_checked=not any(m == "selective" for m in run_modes.values()))
    prog.manifest_expected = manifest_mod.expected(plan, prog, regions)
    _agree(lambda: manifest_mod.check(prog), world, device)
    return prog


def _agree(check, world: int, device) -> None:
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
