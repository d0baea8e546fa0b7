"""shard_search: the public entry (placeholder body replaced by the recursive search below)."""
from __future__ import annotations

from dataclasses import dataclass

from ..costmodel import CostSettings, ShardingCost


@dataclass
class ShardingResult:
    strategies: dict             # node name -> tuple (one entry per mesh level)
    cost: ShardingCost
    method: str
    feasible: bool = True
    memory_bytes: float = 0.0    # peak per-device estimate (model states + saved activations)
    search_s: float = 0.0        # wall time of the search (not part of any plan file)


def shard_search(graph, mesh, cluster, settings=CostSettings(), *, memory_budget=None, level_roles=None,
                 method="recursive") -> ShardingResult:
    from .driver import run
    return run(graph, mesh, cluster, settings, memory_budget=memory_budget, level_roles=level_roles,
               method=method)
