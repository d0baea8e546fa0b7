"""What the recipe's steps share (sapp/emit/recipe.py): `Build`, made once from the plan by `start`.

`Build` is the model, the plan and a few typed groups, each with one meaning:

  Rank            who this process is: rank, world, device, coords (pp_i, dp_i, tp_i), mesh  (frozen)
  Layout          the plan's degrees: pp, dp, tp, cp, ep (+ EP groups), stages, tp styles, ZeRO  (frozen)
  Training        what training is asked for: lr, optimizer, grad_sync, allow_mismatch, example
                  inputs, precision (mixed, half)  (frozen)
  RecomputePlan   what the recompute section resolves to: blocks, modes as planned / as run,
                  the selective blocks' priced regions  (frozen)
  Placement       the plan's placement section and whether it places host tables  (frozen)
  Audit           what the checks before the first step found: replicated parameters applied to a
                  rank's share (partial), fused projections split by heads (fused), notes (appended
                  to by the steps)
  Made            what the steps make, in the order the recipe runs them: stages, wrappers, hooks,
                  optimizers, the schedule (the one mutable group)

Each step (sapp/emit/steps/) names the groups it reads in its signature where that is few, else takes
the `Build`; its docstring says what it reads and what it writes into `Made`."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import PlanError
from .checks import plan as checks
from .ep import experts as ep_mod
from .recompute import checkpointing as recompute
from .runtime.dist import default_device
from .runtime.program import _tuple
from .tp import parallel


@dataclass(frozen=True)
class Rank:
    """This process: its global rank, the world size, its device, its coords (pp_i, dp_i, tp_i) and
    the DeviceMesh (pp, dp, tp) (None in one process)."""
    rank: int
    world: int
    device: torch.device
    coords: tuple
    mesh: object


@dataclass(frozen=True)
class Layout:
    """The plan's parallel degrees for the emitter.  `dp` is the gradient group: dp x cp under context
    parallelism (`dp // cp` the data-parallel replicas).  `zero` the ZeRO stage planned (the stage that
    runs is `Made.zero`); `ep_groups` (EP group, expert-DP group, rank in the EP group) when ep > 1."""
    pp: int
    dp: int
    tp: int
    cp: int
    ep: int
    ep_groups: tuple | None
    n_stages: int
    tp_styles: dict                # tp_modules of the plan
    zero: int

    @property
    def local_zero1(self) -> bool:
        """ZeRO-1 as sapp/emit/dp/zero1.py runs it: gradients synchronised like ZeRO-0, optimizer
        states sharded element by element over dp."""
        return self.zero == 1 and self.dp > 1


@dataclass(frozen=True)
class Training:
    """What training is asked for: the optimizer and its lr, the gradient sync, whether a mismatch
    with the plan is allowed, the example inputs as given to emit (None: the zoo makes them when
    needed) and the precision (mixed: bf16-/fp16-mixed autocast in `half`)."""
    lr: float
    optimizer: str
    grad_sync: str
    allow_mismatch: bool
    example_inputs: tuple | None
    mixed: bool
    half: torch.dtype

    def autocast(self, device: torch.device):
        return torch.autocast(device.type, dtype=self.half) if self.mixed else contextlib.nullcontext()

    @property
    def precision(self) -> str:
        """What runs (autocast's dtype), as the plan spells precisions."""
        return "fp32" if not self.mixed else "fp16-mixed" if self.half == torch.float16 else "bf16-mixed"


@dataclass(frozen=True)
class RecomputePlan:
    """The recompute section resolved on the model: block names (recompute and FSDP units), the mode
    per block as planned, as run (a selective block without a region dropped when allowed), and the
    selective blocks' priced regions."""
    blocks: list
    modes: dict
    run_modes: dict
    regions: dict


@dataclass(frozen=True)
class Placement:
    """The plan's placement section; `host_groups`: it places host tables (groups) at all."""
    section: dict
    host_groups: bool


@dataclass(frozen=True)
class Audit:
    """What the checks before the first step found: replicated parameters applied to a rank's share
    (`partial`), fused projections split by heads ({module: piece sizes}, `fused`), and the notes
    (a list the steps append to)."""
    partial: list
    fused: dict
    notes: list


@dataclass
class Made:
    """What the steps make, in the order the recipe runs them."""
    stages: dict                   # stage index -> module (the model without pp)
    zero: int                      # the ZeRO stage that runs
    traced: object = None          # the traced pipeline (None: no pipeline)
    mine: list = field(default_factory=lambda: [0])       # this rank's stage indices
    wrapped: dict = field(default_factory=dict)           # stage index -> module wrapped for dp
    hooks: list = field(default_factory=list)             # run after backward, before the optimizers
    optimizers: list = field(default_factory=list)
    recomputed: dict = field(default_factory=dict)
    dp_excluded: dict = field(default_factory=dict)       # stage -> parameter names kept out of DDP/FSDP
    sparse_names: dict = field(default_factory=dict)      # stage -> device sparse tables
    expert_params: dict = field(default_factory=dict)     # stage -> expert parameters (EP)
    schedule: object = None
    fused_params: dict = field(default_factory=dict)      # permuted parameters: {name: (axis, sizes, tp)}


@dataclass
class Build:
    """The model, the plan and the groups above: what the recipe hands its steps."""
    model: nn.Module
    plan: object
    rank: Rank
    layout: Layout
    training: Training
    recompute: RecomputePlan
    placement: Placement
    audit: Audit
    made: Made


def plan_precision(plan) -> str:
    """The training precision the plan was priced for; a plan that names none (hand-written) trains
    in fp32."""
    prec = (plan._d.get("settings") or {}).get("precision", "fp32")
    if prec not in ("bf16-mixed", "fp16-mixed", "fp32"):
        raise PlanError(f"plan settings.precision {prec!r} is not supported; use 'bf16-mixed', 'fp16-mixed' or 'fp32'")
    return prec


def example_inputs(model, example, mbs, device):
    """The given example inputs, else the zoo's at micro-batch `mbs`."""
    if example is not None:
        return _tuple(example)
    try:
        import sapp.models as models  # not `from .. import`: sapp.__getattr__ recurses on it
        return _tuple(models.example_inputs(model, mbs, device))
    except Exception as e:
        raise PlanError("pipeline and tensor-parallel plans need example inputs to trace the model; pass emit(..., example_inputs=...) "
                        f"(the model zoo could not make them: {type(e).__name__})") from None


def start(model, plan, rank, world, device, *, lr, optimizer, grad_sync, allow_mismatch, example, audit) -> Build:
    """The plan's numbers for this rank.  `audit`: (notes, partial, fused) of the checks before the first step."""
    par = plan.parallel
    device = torch.device(device) if device is not None else default_device()
    pp, dp, tp, cp = par["pp"], par["dp"], par["tp"], par.get("cp", 1)
    # context parallelism: parameters are replicated over dp x cp, so from here on "dp" is that
    # gradient group; the data shard and the attention know the split (sapp/emit/cp/cp.py)
    dp = dp * cp
    me = parallel.coords(rank, pp, dp, tp)
    mesh = parallel.build_mesh(device, pp, dp, tp) if world > 1 else None
    notes, partial, fused = audit
    ep = ep_mod.check(plan, model)      # the plan's ep (refused in the checks before when not emitted)
    ep_groups = ep_mod.groups(pp, dp, tp, ep, rank) if ep > 1 else None
    modes = recompute.plan_modes(plan.recompute, model)
    blocks = recompute.block_names(model)
    try:
        regions = recompute.priced_regions(model, modes, _tuple(example) if example is not None else None)
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
    # bf16-mixed as priced: fp32 weights, bf16 compute (autocast) and bf16 gradient communication.
    # Pipeline stages run their forward under autocast themselves and hand fp32 activations to the
    # next stage (a stage's boundary dtype is fixed when it is built).
    # fp16-mixed (GPUs without bf16, e.g. V100): the same with fp16 autocast; loss scaling is not emitted
    prec = plan_precision(plan)
    placement = plan.placement or {}
    return Build(
        model=model, plan=plan, rank=Rank(rank=rank, world=world, device=device, coords=me, mesh=mesh),
        layout=Layout(pp=pp, dp=dp, tp=tp, cp=cp, ep=ep, ep_groups=ep_groups,
                      n_stages=checks.stage_count(plan) if pp > 1 else 1, tp_styles=tp_styles, zero=plan.zero),
        training=Training(lr=lr, optimizer=optimizer, grad_sync=grad_sync, allow_mismatch=allow_mismatch,
                          example_inputs=example, mixed=prec in ("bf16-mixed", "fp16-mixed"),
                          half=torch.float16 if prec == "fp16-mixed" else torch.bfloat16),
        recompute=RecomputePlan(blocks=blocks, modes=modes, run_modes=run_modes, regions=regions),
        placement=Placement(section=placement, host_groups=bool(placement.get("groups") or {})),
        audit=Audit(partial=partial, fused=fused, notes=notes),
        made=Made(stages={0: model}, zero=plan.zero))
