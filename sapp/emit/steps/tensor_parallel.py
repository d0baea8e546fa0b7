"""Step: tensor and sequence parallelism -- the searched layout (tp_modules, tp_groups, the SP
section) applied with DTensor on mesh["tp"] (sapp/emit/tp/)."""
from __future__ import annotations

from ..build import Build
from ..checks import plan as checks
from ..tp import parallel, sp as sp_mod


def apply(b: Build, s: int) -> None:
    if b.tp == 1 or not b.tp_styles:
        return
    parallel.apply_tp(b.stages[s], b.tp_styles, b.mesh["tp"], b.notes,
                      originals=dict(b.model.named_modules()) if b.traced is not None else None,
                      groups=checks.tp_groups(b.plan), sp_sec=sp_mod.section(b.plan),
                      parts=b.fused, permuted=b.fused_params)


def partial_grads(b: Build) -> None:
    """Replicated weights applied to this rank's heads only (the shape audit's `partial`): their
    gradients summed over tp, before any data-parallel sync."""
    if not b.partial:
        return
    names = set(b.partial)
    ids = {id(p) for n, p in b.model.named_parameters() if n in names}
    mine = [p for mod in b.stages.values() for p in mod.parameters() if id(p) in ids]
    if mine:
        b.hooks.insert(0, parallel.TPPartialGrads(mine, b.mesh["tp"].get_group()))
        b.notes.append(f"tp: {len(mine)} replicated parameter(s) applied to this rank's share of a split "
                       f"axis (e.g. {sorted(b.partial)[0]}): gradients summed over the tp group")
