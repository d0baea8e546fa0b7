"""Step: recomputation -- the plan's blocks checkpointed, whole or selectively (sapp/emit/recompute/)."""
from __future__ import annotations

from ..build import RecomputePlan
from ..recompute import checkpointing as recompute


def apply(module, plan: RecomputePlan) -> dict:
    """Wraps `module`'s (one stage's) blocks in place as `plan.run_modes` and `plan.regions` say;
    returns what was checkpointed ({block: {"mode", "region", ...}}, for `Made.recomputed`)."""
    return recompute.apply(module, plan.run_modes, plan.regions)
