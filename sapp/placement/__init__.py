"""Host/device placement: embedding tables (+ their sparse optimizers) and optimizer states on the host.

Interface used by the joint search (H3): `placement_options(...)` returns the placements worth
considering for one pipeline stage, "device" first.  (Full cost model lands in cost.py/decide.py.)
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PlacementOption:
    name: str                  # "device", "embedding-host", "optimizer-host", "embedding+optimizer-host"
    device_bytes_saved: float  # per device, vs. everything on the device
    extra_time_s: float        # step time added after overlap with device compute
    host_bytes: float          # host memory per node this stage needs
    section: dict = field(default_factory=dict)  # the plan's "placement" section


def placement_options(graph, node_names, cluster, settings, *, dp=1, tp=1, zero=0, micro_batches=1,
                      compute_s=0.0, pins=None, micro_batch_size=None):
    return [PlacementOption("device", 0.0, 0.0, 0.0, {"groups": {}, "predicted": {}})]


__all__ = ["PlacementOption", "placement_options"]
