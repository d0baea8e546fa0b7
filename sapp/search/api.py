"""shard_search: the public entry of the sharding search (driver.py runs the chosen method)."""
from __future__ import annotations

from ..costmodel import CostSettings
from .driver import run
from .result import ShardingResult


def shard_search(graph, mesh, cluster, settings=CostSettings(), *, memory_budget=None, level_roles=None,
                 method="recursive") -> ShardingResult:
    return run(graph, mesh, cluster, settings, memory_budget=memory_budget, level_roles=level_roles,
               method=method)
