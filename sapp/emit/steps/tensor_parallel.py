"""Step: tensor and sequence parallelism -- the searched layout (tp_modules, tp_groups, the SP
section) applied with DTensor on mesh["tp"] (sapp/emit/tp/)."""
from __future__ import annotations

from ..build import Audit, Layout, Made, Rank
from ..checks import plan as checks
from ..tp import parallel, sp as sp_mod


def apply(model, plan, layout: Layout, rank: Rank, audit: Audit, made: Made, s: int) -> None:
    """Reads stage `s` (`made.stages[s]`), the layout's tp styles, mesh["tp"], the plan's tp_groups
    and SP section and the audit's fused projections (the whole `model` names a traced stage's
    modules); makes the stage's layers DTensor in place, writes `made.fused_params` (parameters
    permuted) and notes."""
    if layout.tp == 1 or not layout.tp_styles:
        return
    parallel.apply_tp(made.stages[s], layout.tp_styles, rank.mesh["tp"], audit.notes,
                      originals=dict(model.named_modules()) if made.traced is not None else None,
                      groups=checks.tp_groups(plan), sp_sec=sp_mod.section(plan),
                      parts=audit.fused, permuted=made.fused_params)


def partial_grads(model, rank: Rank, audit: Audit, made: Made) -> None:
    """Replicated weights applied to this rank's heads only (the shape audit's `partial`): their
    gradients summed over tp, before any data-parallel sync."""
    partial = audit.partial
    if not partial:
        return
    names = set(partial)
    ids = {id(p) for n, p in model.named_parameters() if n in names}
    mine = [p for mod in made.stages.values() for p in mod.parameters() if id(p) in ids]
    if mine:
        made.hooks.insert(0, parallel.TPPartialGrads(mine, rank.mesh["tp"].get_group()))
        audit.notes.append(f"tp: {len(mine)} replicated parameter(s) applied to this rank's share of a split "
                             f"axis (e.g. {sorted(partial)[0]}): gradients summed over the tp group")
