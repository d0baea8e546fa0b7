"""The outer search: pipeline stages x data x tensor parallel degrees x micro-batches x schedule x
recomputation x ZeRO (x placement) on top of the per-stage sharding search.

Structure (branch and bound, deterministic):
  1. enumerate every configuration (pp, dp, tp, m, schedule, v, zero, cp) the cluster, the batch and the
     constraints allow, each with an analytic lower bound on its step time (perfectly split compute
     plus the pipeline bubble) - no sharding search needed for that;
  2. visit them best-first: the first visit of a (dp·cp, tp) pair builds its per-unit profile (one
     sharding search on the block template, see sapp.pipeline.profile; context parallelism shares
     dp·cp's, sapp/search/joint/cp.py), which gives a tighter bound (the profile's real
     per-micro-batch times, without recomputation) that replaces the analytic one in the order;
  3. survivors get the exact evaluation: memory-constrained min-max stage partition with a per-stage
     recomputation choice, closed-form schedule time, exposed gradient sync;
  4. stop when the next bound is no better than the best found.
Ties are broken by (step time, peak memory, pp, tp, micro-batches, schedule, zero).
"""
from .configs import enumerate_configs
from .divisors import divisors
from .divisors import divisors as _divisors  # noqa: F401  (the name before the package split)
from .context import SearchContext
from .placement import evaluate_config
from .result import Config, JointResult, StageResult
from .search import joint_search

__all__ = ["joint_search", "divisors", "evaluate_config", "enumerate_configs", "SearchContext", "Config", "JointResult", "StageResult"]
