"""What a sharding search returns (below both the public entry api.py and the driver that fills it)."""
from __future__ import annotations

from dataclasses import dataclass

from ..costmodel import ShardingCost


@dataclass
class ShardingResult:
    strategies: dict             # node name -> tuple (one entry per mesh level)
    cost: ShardingCost
    method: str
    feasible: bool = True
    memory_bytes: float = 0.0    # peak per-device estimate (model states + saved activations)
    search_s: float = 0.0        # wall time of the search (not part of any plan file)
