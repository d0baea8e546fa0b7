"""Sharding search: per-op strategies (one split choice per mesh level) minimising the additive cost
of sapp.costmodel.  Methods: "recursive" (level-by-level double recursion + refinement, fast),
"exact" (ortools CP-SAT over the same objective), "exhaustive" (enumeration, tiny graphs)."""
from .api import ShardingResult, shard_search

__all__ = ["shard_search", "ShardingResult"]
