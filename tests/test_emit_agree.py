"""A refusal one rank raises at the end of emit (a pipeline rank compares only its own stages with the
plan) must stop every rank before the first step: before, rank 1 refused and rank 0 went on into the
first step's collectives and waited for it until the process group's timeout (HF DecisionTransformer
pp2).  2 forked gloo ranks, rank 1's check planted to fail; both must raise PlanError at once, rank 1
with its own message, rank 0 saying another rank refused."""
from __future__ import annotations

import json
import os
import time

from tests.emit_workers.harness import fork_ranks


def _worker(rank, world, cases, out_dir, store):
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    from sapp.emit.checks.agree import agree as _agree
    from sapp.errors import PlanError
    res = {}
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=30))

        def check():
            if rank == 1:
                raise PlanError("the emitted program differs from the plan: stages (planted)")

        t0 = time.perf_counter()
        try:
            _agree(check, world, torch.device("cpu"))
            res["raised"] = None
        except PlanError as e:
            res["raised"] = str(e)
        res["seconds"] = time.perf_counter() - t0
        _agree(lambda: None, world, torch.device("cpu"))        # nobody refuses: nobody raises
        res["clean"] = True
        dist.destroy_process_group()
    except BaseException as e:                 # noqa: BLE001 - reported to the test
        res["error"] = f"{type(e).__name__}: {e}"
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    os._exit(0)


def test_a_refusal_on_one_rank_stops_every_rank_before_the_first_step():
    failed, ranks = fork_ranks(_worker, 2, [])
    assert failed is None and set(ranks) == {0, 1}, (failed, ranks)
    assert all("error" not in r for r in ranks.values()), ranks
    assert "planted" in ranks[1]["raised"]
    assert ranks[0]["raised"] and "another rank refused" in ranks[0]["raised"]
    assert all(r["seconds"] < 20 and r["clean"] for r in ranks.values()), ranks
