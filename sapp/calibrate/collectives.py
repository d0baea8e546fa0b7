"""Collective and point-to-point timings over the worker processes, with repetition counts every rank
agrees on."""
from __future__ import annotations

import time


def _collective_op(torch, dist, dev, kind, nbytes):
    """A call of `kind` on a `nbytes` full buffer (fp32): all_reduce in place, all_gather into a full
    output from a 1/n shard, reduce_scatter from a full input into a 1/n shard."""
    n = dist.get_world_size()
    numel = max(n, nbytes // 4 // n * n)
    if kind == "all_reduce":
        x = torch.ones(numel, device=dev)
        return lambda: dist.all_reduce(x)
    full, shard = torch.ones(numel, device=dev), torch.ones(numel // n, device=dev)
    # torch 2.13 renamed the tensor forms (*_single) and warns on the old names; older torch has only those
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if kind == "all_gather":
        return lambda: gather(full, shard)
    return lambda: scatter(shard, full)


FSDP_UNITS, FSDP_WIDTH = 4, 256


def _measure_allreduce(torch, dist, dev, cfg, sync, kind="all_reduce"):
    """Every rank must issue the same number of collectives, so the repetition count is agreed on
    (MAX over ranks) instead of each rank timing until its own clock says stop."""
    out = {}
    for nbytes in cfg["ar_bytes"]:
        op = _collective_op(torch, dist, dev, kind, nbytes)

        def run(reps):
            for _ in range(reps):
                op()
        out[nbytes] = _time_agreed(torch, dist, dev, cfg, sync, run, cap=2000)
    return out


def _time_agreed(torch, dist, dev, cfg, sync, run, cap):
    """Best seconds per call of `run(reps)` (reps calls) over 3 timed rounds, with a repetition count
    every rank agrees on (MAX), since collectives must be issued the same number of times."""
    run(1)
    sync()
    t0 = time.perf_counter()
    run(3)
    sync()
    est = (time.perf_counter() - t0) / 3
    reps = torch.tensor([max(1, min(cap, int(cfg["min_time"] / 3 / max(est, 1e-7))))], device=dev)
    dist.all_reduce(reps, op=dist.ReduceOp.MAX)
    reps = int(reps.item())
    best = float("inf")
    for _ in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        run(reps)
        sync()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def _measure_p2p(torch, dist, dev, cfg, sync):
    """One-way seconds of a point-to-point message per size: ranks 2k and 2k+1 ping-pong (blocking
    send / recv, as a pipeline stage boundary does), half the round trip; every pair at once, so the
    processes contend as a pipeline's do.  An odd last rank only takes part in agreeing the counts."""
    rank, n = dist.get_rank(), dist.get_world_size()
    peer = rank ^ 1 if (rank ^ 1) < n else None
    out = {}
    for nbytes in cfg["ar_bytes"]:
        x = torch.ones(max(1, nbytes // 4), device=dev)

        def ping(reps):
            for _ in range(reps):
                if peer is None:
                    return
                if rank % 2 == 0:
                    dist.send(x, peer)
                    dist.recv(x, peer)
                else:
                    dist.recv(x, peer)
                    dist.send(x, peer)
        # a round trip per call: one way is half of it
        out[nbytes] = _time_agreed(torch, dist, dev, cfg, sync, ping, cap=1000) / 2
    return out
