"""Step: host placement -- the stage on the device, its host tables (and offloaded optimizer's
parameters) kept on the CPU as the plan's placement section says (sapp/emit/host/host.py)."""
from __future__ import annotations

from ..build import Build
from ..host import host


def apply(b: Build, s: int) -> None:
    if b.host_groups:
        host.apply_placement(b.stages[s], b.placement, b.device)
    else:
        b.stages[s].to(b.device)
