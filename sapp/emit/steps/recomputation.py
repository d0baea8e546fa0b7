"""Step: recomputation -- the plan's blocks checkpointed, whole or selectively (sapp/emit/recompute/)."""
from __future__ import annotations

from ..build import Build
from ..recompute import checkpointing as recompute


def apply(b: Build, s: int) -> None:
    b.recomputed.update(recompute.apply(b.stages[s], b.run_modes, b.regions))
