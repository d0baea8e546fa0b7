"""Steps: pipeline stages -- the model cut into traced stages (`split`), gradients of weights tied
across stages summed (`tie`), the stages run by the plan's schedule (`schedule`)."""
from __future__ import annotations

import torch
from torch import nn

from ...errors import PlanError
from ...pipeline.dualpipe import rank_of
from ..build import Layout, Made, Rank, Training, example_inputs
from ..checks import plan as checks
from ..cp import cp as cp_mod
from ..ep import experts as ep_mod
from ..pp import pipe as pipe_mod
from ..tp import parallel


def split(model, plan, layout: Layout, rank: Rank, training: Training) -> tuple:
    """This rank's stages: (traced, mine, stages) for `Made` -- the traced pipeline, this rank's
    stage indices and {index: private copy traced at its micro-batch}; (None, [0], {0: model}) when
    the plan has no pipeline.  Reads the plan's pipeline section and split points, the layout, this
    rank's coords and device, the example inputs and the precision (stages autocast themselves)."""
    if layout.pp == 1:
        return None, [0], {0: model}
    cp = layout.cp
    n_micro = plan.pipeline["micro_batches"]
    gb = plan.model.get("global_batch")
    mbs = plan.pipeline.get("micro_batch_size") or (gb // ((layout.dp // cp) * n_micro) if gb else None)
    if not mbs:
        raise PlanError("pipeline plans need pipeline.micro_batch_size or model.global_batch")
    ex = pipe_mod.micro_example(tuple(x.to("cpu") for x in example_inputs(model, training.example_inputs, mbs, "cpu")), mbs)
    if cp > 1:          # the stage graphs are traced at this rank's share of the sequence
        ex = tuple(cp_mod.shard_sequence(x, cp, rank.coords[1] % cp) if x.dim() >= 2 else x for x in ex)
    tp = layout.tp
    local = parallel.local_layers(model, layout.tp_styles, tp, checks.tp_groups(plan)) if tp > 1 else None
    traced = pipe_mod.trace(model, ex, checks.split_points(plan), local=local)
    sched = plan.pipeline.get("schedule", "none")
    mine = [s for s in range(layout.n_stages) if rank_of(sched, layout.pp, s) == rank.coords[0]]
    stages = pipe_mod.stage_modules(traced, mine)
    if layout.ep > 1:      # the stage's MoE layers eager again, for EP (emit/ep/experts.py)
        ep_mod.eager_moe(stages, model)
    if training.mixed:
        for mod in stages.values():
            _autocast_stage(mod, rank.device, training.half)
    return traced, mine, stages


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


def tie(model, layout: Layout, made: Made, notes: list, schedule: str = "none") -> None:
    """Weights shared by stages (an LM head tied to the embedding): gradients summed between them.
    Reads the traced pipeline and this rank's stages (on the ranks `schedule` places them: the V for
    dualpipev); appends the summing hook to `made.hooks` and a note (nothing without a pipeline)."""
    if made.traced is None:
        return
    tied = pipe_mod.TiedGrads(model, made.traced, layout.n_stages, made.stages, layout.pp, layout.dp, layout.tp,
                              schedule)
    if tied.ties:
        made.hooks.append(tied)
        notes.append(f"{len(tied.ties)} tied parameter(s) shared across pipeline stages: gradients summed between stages")


def schedule(plan, layout: Layout, rank: Rank, made: Made, loss):
    """The plan's schedule over this rank's wrapped stages (`made.wrapped`, for `made.schedule`);
    `loss(out, target)` on the last stage.  None without a pipeline."""
    if made.traced is None:
        return None
    n = layout.n_stages
    if plan.pipeline.get("scatter_gather") and layout.tp > 1:     # Megatron's boundary scatter/gather (priced)
        for s in made.mine:
            pipe_mod.scatter_gather(made.wrapped[s], s, n, rank.mesh["tp"])
    stages = [pipe_mod.pipeline_stage(made.wrapped[s], s, n, rank.device, rank.mesh["pp"].get_group()) for s in made.mine]
    return pipe_mod.build_schedule(plan.pipeline.get("schedule", "none"), stages, plan.pipeline["micro_batches"], loss)
