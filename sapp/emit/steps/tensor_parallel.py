"""Step: tensor and sequence parallelism -- the searched layout (tp_modules, tp_groups, the SP
section) applied with DTensor on mesh["tp"] (sapp/emit/tp/)."""
from __future__ import annotations

from ..build import Build
from ..checks import plan as checks
from ..tp import parallel, sp as sp_mod


def apply(b: Build, s: int) -> None:
    """Reads stage `s` (`made.stages[s]`), the layout's tp styles, mesh["tp"], the plan's tp_groups
    and SP section and the audit's fused projections; makes the stage's layers DTensor in place,
    writes `made.fused_params` (parameters permuted) and notes."""
    layout, made = b.layout, b.made
    if layout.tp == 1 or not layout.tp_styles:
        return
    parallel.apply_tp(made.stages[s], layout.tp_styles, b.rank.mesh["tp"], b.audit.notes,
                      originals=dict(b.model.named_modules()) if made.traced is not None else None,
                      groups=checks.tp_groups(b.plan), sp_sec=sp_mod.section(b.plan),
                      parts=b.audit.fused, permuted=made.fused_params)


def partial_grads(b: Build) -> None:
    """Replicated weights applied to this rank's heads only (the shape audit's `partial`): their
    gradients summed over tp, before any data-parallel sync."""
    partial = b.audit.partial
    if not partial:
        return
    names = set(partial)
    ids = {id(p) for n, p in b.model.named_parameters() if n in names}
    mine = [p for mod in b.made.stages.values() for p in mod.parameters() if id(p) in ids]
    if mine:
        b.made.hooks.insert(0, parallel.TPPartialGrads(mine, b.rank.mesh["tp"].get_group()))
        b.audit.notes.append(f"tp: {len(mine)} replicated parameter(s) applied to this rank's share of a split "
                             f"axis (e.g. {sorted(partial)[0]}): gradients summed over the tp group")
