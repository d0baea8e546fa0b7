"""CI slice of bench/time_truth.py: the ordering relations behind the priced overlaps hold on emitted
programs (ZeRO-3 reduce-scatter overlap and backward prefetch, the 1F1B order, offloaded Adam inside the
last backward), and each check fails on a timeline that breaks its order."""
from __future__ import annotations

import os
import tempfile

import pytest

from bench import time_truth as T
from tests.emit_workers import joblock

_CASE = {"id": "x", "world": 2, "grad_sync": "auto", "rule": "none", "schedule": "none", "m": 1,
         "offload_pipelined": None}
_BWD = [("autograd::engine::evaluate_function: MmBackward0", 10, 20),
        ("autograd::engine::evaluate_function: EmbeddingBackward0", 20, 30)]


def _holds(case, ev, log=(), rank=0):
    return [h for _, h, _ in T.relations({**_CASE, **case}, ev, list(log), rank)]


def test_relations_fail_on_the_wrong_order():
    # rule none: the flat all-reduce after backward holds; one inside backward does not
    assert _holds({"id": "dp2-z0-flat"}, _BWD + [("c10d::allreduce_", 31, 35)]) == [True]
    assert _holds({"id": "dp2-z0-flat"}, _BWD + [("c10d::allreduce_", 25, 35)]) == [False]
    # ddp-buckets: a bucket issued only after the last backward node is no overlap
    assert _holds({"id": "dp2-z0-ddp", "grad_sync": "ddp"}, _BWD + [("c10d::allreduce_", 31, 35)]) == [False]
    assert _holds({"id": "dp2-z0-ddp", "grad_sync": "ddp"}, _BWD + [("c10d::allreduce_", 15, 35)]) == [True]
    # offload priced pipelined: Adam after backward breaks it; priced after backward: Adam inside breaks it
    inside, after = ("sapp.offload_adam.group0", 12, 14), ("sapp.offload_adam.after_backward", 31, 40)
    assert _holds({"id": "offload-dp1", "offload_pipelined": True}, _BWD + [inside]) == [True]
    assert _holds({"id": "offload-dp1", "offload_pipelined": True}, _BWD + [after]) == [False]
    assert _holds({"id": "offload-dp2", "offload_pipelined": False}, _BWD + [inside, after]) == [False]
    # ZeRO-3: block reduce-scatters inside backward, the backward gather of layers.0 before layers.1's reduce
    fsdp = [("FSDP::all_gather (layers.0)", 0, 1), ("FSDP::all_gather (layers.1)", 2, 3),
            ("FSDP::post_backward_reduce (layers.1)", 16, 17), ("FSDP::post_backward_reduce (layers.0)", 22, 23)]
    assert _holds({"id": "dp2-z3", "rule": "fsdp-units"}, _BWD + fsdp + [("FSDP::all_gather (layers.0)", 12, 13)]) \
        == [True, True]
    assert _holds({"id": "dp2-z3", "rule": "fsdp-units"}, _BWD + fsdp + [("FSDP::all_gather (layers.0)", 18, 19)]) \
        == [True, False]
    # pipeline: GPipe's order where 1F1B is priced
    gpipe = [("fwd", 0), ("fwd", 1), ("bwd", 0), ("bwd", 1)]
    assert _holds({"id": "pp", "schedule": "1f1b", "m": 2}, _BWD, gpipe, rank=1) == [False]
    assert _holds({"id": "pp", "schedule": "gpipe", "m": 2}, _BWD, gpipe, rank=1) == [True]


def test_offloaded_adam_runs_inside_the_last_backward_as_priced():
    with tempfile.TemporaryDirectory() as tmp:
        (case,) = T.search_plans([c for c in T.CASES if c[0] == "offload-dp1-m2"], tmp)
        assert case["offload_pipelined"] is True and case["m"] == 2
        rows = T.run_case(case, 0)
    assert rows and all(r["holds"] for r in rows), rows


@pytest.mark.skipif(os.cpu_count() is None, reason="needs processes")
def test_zero3_and_1f1b_orders_hold_on_two_gloo_ranks():
    with joblock.held():
        rows = T.run({"dp2-z3", "pp2-1f1b-m4"}, timeout=300)
    assert {r["id"] for r in rows} == {"dp2-z3", "pp2-1f1b-m4"} and len({r["rank"] for r in rows}) == 2
    assert all(r["holds"] for r in rows), T.table(rows)
