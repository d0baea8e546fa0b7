"""The checks before the recipe's first step: a plan sapp cannot run as priced is refused here, on
every rank, before any process group, trace or collective (sapp/emit/recipe.py)."""
from __future__ import annotations

import torch.distributed as dist

from ...errors import PlanError
from ..cp import cp as cp_mod
from ..ep import experts as ep_mod
from . import plan as checks

# set a sharded region's stored head counts / widths to the rank's share (off only in tests that
# show what the shape audit catches without it)
LOCALISE = True


def run(model, plan, world: int, name: str, example, *, grad_sync: str, fingerprint: bool) -> tuple:
    """(plan, (notes, partial)): the plan as a Plan and what the shape audit found -- its notes and
    the replicated parameters applied to a rank's share of a split axis."""
    if grad_sync not in ("auto", "ddp", "allreduce"):
        raise PlanError(f"grad_sync must be 'auto', 'ddp' or 'allreduce', got {grad_sync!r}")
    plan = checks.as_plan(plan)
    checks.check_all(model, plan, world, name, example, fingerprint=fingerprint)
    par = plan.parallel
    notes, partial = [], []
    if par["tp"] > 1 and checks.tp_groups(plan):
        # before any collective: local head counts set, then every op's shape at one rank's layer
        # shapes checked against the plan's split (sapp/emit/checks/shape_audit.py)
        from ..tp import sp as sp_mod
        from ..build import example_inputs
        from . import shape_audit
        ex = example_inputs(model, example, 2, "cpu")
        shape_audit.check(model, checks.tp_modules(plan), checks.tp_groups(plan), par["tp"], ex, notes,
                          fix=LOCALISE, partial=partial, sp_sec=sp_mod.section(plan) if par["pp"] == 1 else None)
    if world > 1 and not dist.is_initialized():
        raise PlanError("the plan needs several processes but torch.distributed is not initialised; launch with "
                        "`sapp run` / torchrun and call sapp.emit.runtime.dist.init() first")
    if par.get("cp", 1) > 1:
        cp_mod.check_plan(plan)
    ep_mod.check(plan, model)
    return plan, (notes, partial)
