"""Steps: pipeline stages -- the model cut into traced stages (`split`), gradients of weights tied
across stages summed (`tie`), the stages run by the plan's schedule (`schedule`)."""
from __future__ import annotations

import torch
from torch import nn

from ...errors import PlanError
from ..build import Build, example_inputs
from ..checks import plan as checks
from ..cp import cp as cp_mod
from ..ep import experts as ep_mod
from ..pp import pipe as pipe_mod
from ..tp import parallel


def split(b: Build) -> None:
    """This rank's stages (private copies, traced at its micro-batch) in `b.stages`; the model itself
    as stage 0 when the plan has no pipeline."""
    if b.pp == 1:
        return
    plan, cp = b.plan, b.cp
    n_micro = plan.pipeline["micro_batches"]
    gb = plan.model.get("global_batch")
    mbs = plan.pipeline.get("micro_batch_size") or (gb // ((b.dp // cp) * n_micro) if gb else None)
    if not mbs:
        raise PlanError("pipeline plans need pipeline.micro_batch_size or model.global_batch")
    ex = pipe_mod.micro_example(tuple(x.to("cpu") for x in example_inputs(b.model, b.example_inputs, mbs, "cpu")), mbs)
    if cp > 1:          # the stage graphs are traced at this rank's share of the sequence
        ex = tuple(cp_mod.shard_sequence(x, cp, b.coords[1] % cp) if x.dim() >= 2 else x for x in ex)
    local = parallel.local_layers(b.model, b.tp_styles, b.tp, checks.tp_groups(plan)) if b.tp > 1 else None
    b.traced = pipe_mod.trace(b.model, ex, checks.split_points(plan), local=local)
    b.mine = [s for s in range(b.n_stages) if s % b.pp == b.coords[0]]
    b.stages = pipe_mod.stage_modules(b.traced, b.mine)
    if b.ep > 1:      # the stage's MoE layers eager again, for EP (emit/ep/experts.py)
        ep_mod.eager_moe(b.stages, b.model)
    if b.mixed:
        for mod in b.stages.values():
            _autocast_stage(mod, b.device, b.half)


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


def tie(b: Build) -> None:
    """Weights shared by stages (an LM head tied to the embedding): gradients summed between them."""
    if b.traced is None:
        return
    tied = pipe_mod.TiedGrads(b.model, b.traced, b.n_stages, b.stages, b.pp, b.dp, b.tp)
    if tied.ties:
        b.hooks.append(tied)
        b.notes.append(f"{len(tied.ties)} tied parameter(s) shared across pipeline stages: gradients summed between stages")


def schedule(b: Build, loss) -> None:
    """The plan's schedule over this rank's stages; `loss(out, target)` on the last stage."""
    if b.traced is None:
        return
    plan = b.plan
    if plan.pipeline.get("scatter_gather") and b.tp > 1:     # Megatron's boundary scatter/gather (priced)
        for s in b.mine:
            pipe_mod.scatter_gather(b.wrapped[s], s, b.n_stages, b.mesh["tp"])
    stages = [pipe_mod.pipeline_stage(b.wrapped[s], s, b.n_stages, b.device, b.mesh["pp"].get_group()) for s in b.mine]
    b.schedule = pipe_mod.build_schedule(plan.pipeline.get("schedule", "none"), stages, plan.pipeline["micro_batches"], loss)
