"""Test helper: hand-made sapp.plan.Plan objects in the documented schema (until sapp.search lands,
and to force modes the search would not pick)."""
from __future__ import annotations

from sapp.plan import Plan, empty_sections


def make_plan(*, name="test", params=0, global_batch=8, dp=1, tp=1, pp=1, schedule=None, micro_batches=1,
              split_before=(), virtual_chunks=1, zero=0, recompute_default="none", recompute_blocks=None,
              tp_modules=None, placement_groups=None, step_time_s=0.01, precision=None) -> Plan:
    d = {"schema": "sapp.plan/1",
         "model": {"name": name, "fingerprint": "", "params": params, "global_batch": global_batch, "meta": {}},
         "cluster": {"name": "cpu"}, "devices": dp * tp * pp, "parallel": {"dp": dp, "tp": tp, "pp": pp},
         "mesh": {"levels": [{"size": dp * tp, "link": "intra"}]}, "operators": {},
         "tp_modules": dict(tp_modules or {}),
         "predicted": {"step_time_s": step_time_s, "peak_memory_bytes": 0, "mfu": 0.0, "compute_s": step_time_s,
                       "comm_s": 0.0}}
    d.update(empty_sections())
    n_stages = pp * (virtual_chunks if schedule == "interleaved" else 1)
    if pp > 1:
        points = list(split_before)
        assert len(points) == n_stages - 1, (points, n_stages)
        stages = [{"index": i, "blocks": [], "split_before": points[i] if i < len(points) else None,
                   "devices": [i]} for i in range(n_stages)]
        d["pipeline"] = {"schedule": schedule or "1f1b", "micro_batches": micro_batches,
                         "micro_batch_size": global_batch // (dp * micro_batches),
                         "virtual_chunks": virtual_chunks, "stages": stages}
    elif micro_batches > 1:          # pp = 1: gradient accumulation over micro-batches
        d["pipeline"]["micro_batches"] = micro_batches
    d["zero"] = zero
    d["recompute"] = {"default": recompute_default, "blocks": dict(recompute_blocks or {})}
    if precision:
        d["settings"] = {"precision": precision}
    if placement_groups:
        d["placement"] = {"groups": placement_groups, "predicted": {}}
    return Plan(d)
