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

A configuration's step: the schedule over per-micro-batch stage times (compute, resharding, ZeRO-3
gathers, recomputation, stage-boundary sends) + the exposed gradient sync (costmodel/gradsync.py) +
the optimizer update + the closing loss all-reduce + exposed host time.  A stage's memory: model states
as the emitter holds them + activations x micro-batches in flight (after the per-block recompute
choice) + a transient, under `Cluster.usable_memory`.  Per-unit time is convex piecewise-linear in
the micro-batch size (sampled and interpolated exactly), activation memory affine in it.

How the dimensions meet:
  - one `Config` (result.py) carries pp, dp, tp, m, mbs, schedule, v, ZeRO and, with defaults, cp, ep
    and sp; devices = pp·dp·cp·tp; a cp configuration prices on the (dp·cp, tp, sp) profile at mbs/cp
    samples per rank (cp.py); ep is searched only without cp (the emitter does not combine them);
  - cp is searched in every form from `LONG_CONTEXT` tokens per sample, below that only where the
    emitter runs it or when pinned (configs.py);
  - a tp degree whose layout shards nothing is priced as the replication it is (plan note), and with tp
    free is evaluated only when no tp = 1 configuration fits; where the sharding search's own pick is a
    form DTensor cannot run, the layout sharding every valid region is priced beside it and the faster
    kept (search/tp_layout.search_fn);
  - a plan with a strategy the emitter cannot run (the fused runtime's kernels) says so in its notes,
    and `sapp run` refuses it in one line: priced-only strategies are never run otherwise than priced.

What is computed once per search, profile or configuration instead of per evaluation (kv terms,
ZeRO-3 gather curves, parameter owners, the SP layout per tp degree, memoised node costs and edge
times, shared capacity-free stage tables, bound terms) returns what the plain computation would, by
the same operations in the same order: plans stay byte-identical (`python -m bench.plan_golden check`).
"""
from .configs import enumerate_configs
from .divisors import divisors
from .divisors import divisors as _divisors  # noqa: F401  (the name before the package split)
from .context import SearchContext
from .placement import evaluate_config
from .result import Config, JointResult, StageResult
from .search import joint_search

__all__ = ["joint_search", "divisors", "evaluate_config", "enumerate_configs", "SearchContext", "Config", "JointResult", "StageResult"]
