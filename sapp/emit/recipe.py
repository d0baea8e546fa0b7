"""emit(model, plan) -> Program: this rank's part of the training program a plan describes, built by
applying one step per plan feature in a fixed order (the order and why: sapp/emit/__init__.py)."""
from __future__ import annotations

import functools

from torch import nn

from ..capture.blocks import container_children
from . import build as build_mod
from .checks import before, manifest as manifest_mod
from .checks.agree import agree
from .cp.program import CPProgram
from .runtime.dist import rank_world
from .runtime.program import Program, _resolve_loss, _tuple
from .steps import (context_parallel, data_parallel, expert_parallel, host_placement, optimizers, pipeline,
                    recomputation, same_start, sparse_tables, tensor_parallel)


def emit(model: nn.Module, plan, *, loss_fn=None, rank=None, world=None, device=None, lr: float = 1e-3,
         optimizer: str = "adam", example_inputs=None, name: str = "", check_fingerprint: bool = True,
         grad_sync: str = "auto", allow_mismatch: bool = False, reprice=None) -> Program:
    """Turn `plan` into this rank's training program for `model` (built on every rank; every rank
    starts from rank 0's parameters and buffers, steps/same_start.py).  The process group must be initialised when the
    plan has more than one device (sapp.emit.runtime.dist.init() does it from the torchrun environment).

    loss_fn(logits, targets): the loss, called on `logits_of(model output)` (an HF output's .logits),
    as capture calls it (sapp.models.WithLoss): one contract for search and training.
    example_inputs: one batch of model inputs (any batch size); needed to trace pipeline plans and to
    fingerprint non-zoo models.  check_fingerprint=False skips the capture-based model check (the
    parameter-count and zoo-name checks still run), e.g. when a launcher already did it.
    grad_sync (data parallelism without ZeRO-2/3): "auto" = DDP on CUDA, one flat all-reduce after
    backward on CPU; "ddp" or "allreduce" force one.
    allow_mismatch: where what runs differs from the plan (see sapp/emit/checks/manifest.py), keep going with
    a loud note and a re-priced prediction instead of raising PlanError.
    reprice(model, plan) -> dict: what prices the program that runs when it differs from the plan
    (sapp.evaluate; sapp.emit passes sapp.api.reprice_as_run: the emitter takes it from its caller, as it
    sits below the api).  None: an allowed mismatch is noted, not re-priced."""
    rank, world = rank_world(rank, world)
    example = _tuple(example_inputs) if example_inputs is not None else None
    plan, audit = before.run(model, plan, world, name, example, grad_sync=grad_sync, fingerprint=check_fingerprint)
    b = build_mod.start(model, plan, rank, world, device, lr=lr, optimizer=optimizer, grad_sync=grad_sync,
                        allow_mismatch=allow_mismatch, example=example_inputs, audit=audit)
    loss = _resolve_loss(model, loss_fn)
    rk, lay, made, notes = b.rank, b.layout, b.made, b.audit.notes
    same_start.apply(model, rk, notes)          # rank 0's weights everywhere, before anything is split
    context_parallel.apply(model, lay, rk)      # whole model, before any trace: stages run the cp attention
    # this rank's stages (traced copies); the model itself without pp
    made.traced, made.mine, made.stages = pipeline.split(model, plan, lay, rk, b.training)
    for s in made.mine:                         # each stage, in this order:
        mod = made.stages[s]
        # on the device, host tables on the CPU (before any wrapper); checkpoint wrappers around the plain blocks
        host_placement.apply(mod, b.placement, rk.device)
        made.recomputed.update(recomputation.apply(mod, b.recompute))
        tensor_parallel.apply(model, plan, lay, rk, b.audit, made, s)   # DTensor layers (and SP) inside the checkpointed blocks
        sparse_tables.apply(lay, rk, b.placement, made, s)  # host / sparse tables out of the dp sync
        expert_parallel.apply(lay, made, s)     #   experts over EP groups, out of the dp sync
        # DDP / all-reduce / FSDP2 around all of that
        data_parallel.apply(lay, rk, b.training, b.recompute, made, notes, s)
    tensor_parallel.partial_grads(model, rk, b.audit, made)   # tp sums of replicated weights: the first hook after backward
    pipeline.tie(model, lay, made, notes, plan.pipeline.get("schedule", "none"))   # tied weights across stages: summed after the dp sync
    for s in made.mine:
        # after the wrappers (FSDP2 swaps parameters for DTensors)
        optimizers.apply(plan, lay, rk, b.training, b.placement, b.recompute, made, s)
    made.schedule = pipeline.schedule(plan, lay, rk, made, loss)   # the wrapped stages in the plan's schedule
    prog = _program(b, loss)
    prog.reprice = reprice              # before the first check: the manifest re-prices through it
    prog.manifest_expected = manifest_mod.expected(plan, prog, b.recompute.regions)
    agree(lambda: manifest_mod.check(prog), world, rk.device)
    return prog


def _program(b, loss) -> Program:
    model, plan, rk, lay, made, rec = b.model, b.plan, b.rank, b.layout, b.made, b.recompute
    cp = lay.cp
    extra = {"cp": cp, "dp_only": lay.dp // cp, "cp_rank": rk.coords[1] % cp} if cp > 1 else {}
    return (CPProgram if cp > 1 else Program)(
        **extra, plan=plan, rank=rk.rank, world=rk.world, device=rk.device, coords=rk.coords, pp=lay.pp, dp=lay.dp,
        tp=lay.tp, ep=lay.ep, mesh=rk.mesh, modules=[made.wrapped[s] for s in made.mine], stage_indices=made.mine,
        optimizers=made.optimizers, grad_hooks=made.hooks, schedule=made.schedule, loss_fn=loss, notes=b.audit.notes,
        fused_params=made.fused_params, recomputed=sorted(d["region"] for d in made.recomputed.values() if d["region"]),
        recompute_done=made.recomputed, micro_batches=plan.pipeline.get("micro_batches", 1), zero=made.zero,
        autocast=functools.partial(b.training.autocast, rk.device),
        # what runs (autocast's dtype) vs what was priced
        precision=b.training.precision, plan_precision=build_mod.plan_precision(plan),
        first_stage=0 in made.mine, last_stage=(lay.n_stages - 1) in made.mine,
        # what the manifest needs of the whole model (a pipeline rank holds only its stages)
        block_list=rec.blocks, recompute_modes=rec.modes, stage_block_list=sorted(container_children(model)),
        full_modules={n: type(m) for n, m in model.named_modules()},
        full_model=model if made.traced is None else None, allow_mismatch=b.training.allow_mismatch,
        runtime_checked=not any(m == "selective" for m in rec.run_modes.values()))
