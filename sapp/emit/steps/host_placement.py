"""Step: host placement -- the stage on the device, its host tables (and offloaded optimizer's
parameters) kept on the CPU as the plan's placement section says (sapp/emit/host/host.py)."""
from __future__ import annotations

from ..build import Placement
from ..host import host


def apply(module, placement: Placement, device) -> None:
    """Moves `module` (one stage) in place: onto `device`, its host tables on the CPU when the
    placement section places any."""
    if placement.host_groups:
        host.apply_placement(module, placement.section, device)
    else:
        module.to(device)
