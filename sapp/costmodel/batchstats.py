"""Normalisation by batch statistics (BatchNorm in training mode) under data parallelism.

One process normalises by the whole batch's mean and variance; the emitter makes every dp replica
do the same by reducing per-channel statistics over the dp group (emit/dp/batch_stats.py), small
collectives in each layer's forward and backward, on the critical path (nothing to
overlap them with: the next op needs the result).  On an accelerator torch's SyncBatchNorm
all-gathers each rank's (mean, invstd, count) in forward and all-reduces (sum dy, sum dy·x̂) in
backward; on a CPU our module all-reduces (sum, count) and then the squared deviations from the
global mean (two passes, as one process computes them) in forward, (sum dy, sum dy·x̂) in backward.  Pure: no torch, no I/O."""
from __future__ import annotations

from .primitives import collective_time

FP32 = 4


def batch_stat_channels(graph) -> tuple:
    """Channel counts of the graph's train-mode batch norms (capture marks them `batch_stats`), in
    graph order; empty for a model without any."""
    return tuple(n.out.shape[1] for n in graph.nodes.values()
                 if n.extra.get("batch_stats") and len(n.out.shape) > 1)


def batch_stats_sync_time(channels, n: int, link: str, cluster) -> float:
    """Seconds per micro-batch (forward + backward) the statistics' collectives of batch norms with
    `channels` take over a dp group of `n` on `link`, as the emitted module runs them."""
    if n <= 1 or not channels:
        return 0.0
    accelerator = getattr(cluster, "async_launch", True)      # emit: torch's SyncBatchNorm off the CPU
    total = 0.0
    for c in channels:
        if accelerator:
            total += collective_time("all_gather", (2 * c + 1) * FP32 * n, n, link, cluster)
            total += collective_time("all_reduce", 2 * c * FP32, n, link, cluster)
        else:       # forward (sum, count), then the squared deviations; backward (sum dy, sum dy x_hat)
            total += (collective_time("all_reduce", (c + 1) * FP32, n, link, cluster)
                      + collective_time("all_reduce", c * FP32, n, link, cluster)
                      + collective_time("all_reduce", 2 * c * FP32, n, link, cluster))
    return total
