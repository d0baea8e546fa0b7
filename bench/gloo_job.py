"""One gloo job for the benchmarks that run emitted programs rank by rank (bench/time_truth.py,
bench/emitter_overhead.py): the ranks are forked once (tests/emit_workers/harness.fork_ranks) and run
every case in turn; each case's result, or its error in one line, lands under its "id".

    python -m bench.<module> --job WORLD CASES.json OUT.json   ->  job(run_case, WORLD, CASES, OUT)"""
from __future__ import annotations

import functools
import json
import os
import sys


def _worker(run_case, rank, world, cases, out_dir, store):
    import traceback
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    res, code = {}, 0
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=120))
        for case in cases:
            try:
                res[case["id"]] = run_case(case, rank)
            except Exception as e:
                res[case["id"]] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}
            dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        res["__job__"] = {"error": traceback.format_exc()}
        code = 1
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def job(run_case, world: int, cases_path: str, out_path: str) -> None:
    """Fork `world` ranks running run_case(case, rank) over the cases; writes {failed, ranks: {rank: {id: result}}}."""
    from tests.emit_workers.harness import fork_ranks
    with open(cases_path) as f:
        cases = json.load(f)
    failed, per_rank = fork_ranks(functools.partial(_worker, run_case), world, cases)
    with open(out_path, "w") as f:
        json.dump({"failed": failed, "ranks": per_rank}, f)
