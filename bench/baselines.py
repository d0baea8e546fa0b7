"""Hand-made configurations sapp is compared with, each scored by the same cost model through
`sapp.search` with pinned constraints (so a baseline gets its best micro-batch count etc. but not a
different parallel layout).

  dp        pure data parallel (DDP): dp = devices, tp = pp = 1, no ZeRO, no recomputation;
            gradient accumulation (micro-batches) allowed.
  zero3     DP + ZeRO-3 (FSDP): dp = devices, tp = pp = 1, ZeRO-3, recomputation allowed.
  megatron  the usual Megatron-LM recipe: tp = devices per node (capped by the device count),
            the smallest pp that fits, dp = the rest, 1F1B, no ZeRO; micro-batches and
            recomputation free.
An infeasible baseline is reported as OOM, never dropped."""
from __future__ import annotations

from sapp.errors import ConstraintError, InfeasibleError, SappError

BASELINES = ("dp", "zero3", "megatron")


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def baseline_constraints(name, cluster, devices):
    """The list of constraint dicts to try in order (the first feasible wins)."""
    if name == "dp":
        return [{"dp": devices, "tp": 1, "pp": 1, "zero": 0, "recompute": "none"}]
    if name == "zero3":
        return [{"dp": devices, "tp": 1, "pp": 1, "zero": 3}]
    if name == "megatron":
        tp = min(cluster.gpus_per_node, devices)
        return [{"tp": tp, "pp": pp, "schedule": "1f1b" if pp > 1 else "none", "zero": 0}
                for pp in _divisors(devices // tp)]
    raise SappError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")


def run_baseline(name, search, model, cluster, devices, global_batch):
    """(plan or None, status, constraints used).  status: "ok", "OOM" (nothing fits) or
    "n/a: reason" (the pins contradict the batch/cluster, e.g. batch not divisible by dp)."""
    oom, reason = False, ""
    for cons in baseline_constraints(name, cluster, devices):
        try:
            return search(model, cluster, global_batch, cons), "ok", cons
        except InfeasibleError:
            oom = True
        except ConstraintError as e:
            reason = reason or f"n/a: {e}"
    return None, ("OOM" if oom or not reason else reason), None
