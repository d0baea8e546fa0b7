"""Cost of host placement, per device and per training step.  Pure: plain numbers in, numbers out.

Two mechanisms (REFERENCE.md sections 1 and 2):

Embedding on host (MindSpore host+device Wide&Deep).  A table lives in host memory in fp32 with its
sparse optimizer state; per micro-batch the CPU gathers the looked-up rows, they go host->device
(activations), their gradients come device->host, and once per step the sparse optimizer updates the
touched rows.  With tp > 1 a dp replica's table is split by rows over its tp ranks (each rank gathers
and ships the rows it owns); tables are replicated over dp replicas (no ZeRO on the host), and with
dp > 1 the sparse row gradients are all-gathered between replicas over the network.

Optimizer on host (ZeRO-Offload).  Weights stay on the device in the training precision; the fp32
master copy, the Adam moments and an fp32 gradient accumulator live on the host.  Gradients stream
device->host bucket by bucket as backward produces them (so the device holds only a bucket of them),
are accumulated on the host over micro-batches, the CPU runs Adam once per step, and the updated
weights go host->device.  With ZeRO >= 1 each dp rank offloads only its 1/dp shard.

Shared-resource model: the devices of one node doing host work split the node's host memory
bandwidth (and CPU FLOP/s) evenly; each device has its own PCIe link (`h2d_bw` per direction).

Overlap model (stated so plans can be checked against it):
  * `OVERLAP` (0.8) of a device's compute time is usable to hide host work and transfers behind
    (launch/synchronisation gaps and DMA contention take the rest).
  * backward is `BWD_SHARE` (2/3) of compute.
  * Embeddings, priced as sapp/emit/host/host.HostEmbedding runs them: nothing hides.  A micro-batch's
    lookup runs on the CPU at the start of its forward, before any device work of that micro-batch
    is queued, and its rows' gradient comes back to the host synchronously in the last node of its
    backward, so the next micro-batch's lookup starts only after that backward ended (checked by
    bench/time_truth.py); the sparse optimizer (+ replica sync) follows the last backward.  Every
    lookup, copy and update is exposed (a prefetching lookup pipeline is not emitted).
  * Optimizer offload without data parallelism (dp = 1; what sapp/emit/host/host.OffloadAdam(overlap=True)
    runs): gradients stream to the host as backward accumulates them; for all but the last
    micro-batch the gradient copy and the host accumulate hide behind the next micro-batch's compute.
    In the last backward each of the G parameter groups (blocks) is updated as soon as its gradients
    are final.  On a GPU the copies leave from backward's hooks and lengthen backward by their link
    time, and one worker thread runs each group's CPU Adam then its weight copy:
    exposed = T_d2h + max(0, T_adam + T_h2d - OVERLAP * backward) + (T_adam + T_h2d) / G.
    On a CPU device the hook does all three inline: exposed = T_d2h + T_adam + T_h2d.  The next
    step's forward needs the first layer, updated last, so nothing hides behind the next forward.
    (Measured on one H200 with this host's rates, bench/gpu_offload.py; until this structure the price
    assumed a 3-stage pipeline of copy, Adam and copy and was 35-39% under what ran.)
  * Optimizer offload with dp > 1: a gradient is final only after the data-parallel sync (DDP / one
    flat all-reduce / FSDP2's reduce-scatter), which owns the device gradients, so the emitted
    OffloadAdam copies them once after backward, runs CPU Adam over every master, then copies the
    weights back: T_d2h + T_adam + T_h2d exposed, the gradients (at the ZeRO stage's size) stay on the
    device, and no extra per-micro-batch sync.  bench/time_truth.py checks both orders on the program.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..costmodel import collective_time, model_state_bytes, sparse_table_state_bytes

OVERLAP = 0.8
BWD_SHARE = 2.0 / 3.0
# Random gathers/scatters of rows of a few hundred bytes (lookups, sparse optimizer row updates)
# reach about half of streaming host bandwidth.
GATHER_EFFICIENCY = 0.5
# Lazy Adam / FTRL per touched fp32 element: read param, grad, 2 states (16 B), write param and
# 2 states (12 B), plus coalescing the sparse gradient (read + write its values, 8 B).
ROW_UPDATE_BYTES = 36
# Host bytes per element of a host table: fp32 weights + 2 fp32 optimizer states (m, v for lazy
# Adam; z, n for FTRL).
HOST_TABLE_BYTES = 12
# CPU Adam per fp32 parameter: read master, grad, m, v (16 B), write master, m, v (12 B); in mixed
# precision also write the half-precision copy that goes to the device.
ADAM_BYTES_FP32 = 28
ADAM_FLOPS = 12
# Host bytes per offloaded parameter: fp32 master + m + v + fp32 gradient accumulator.
HOST_OFFLOAD_BYTES = 16


@dataclass(frozen=True)
class Table:
    """One embedding table as the cost model sees it."""
    name: str                  # parameter qualname
    rows: int
    dim: int
    lookups: int               # rows looked up per micro-batch per dp replica (ids numel)
    kind: str = "sparse_adam"  # host optimizer: "sparse_adam" (lazy Adam) | "ftrl"


@dataclass(frozen=True)
class HostCost:
    host_s: float              # host-side busy time per step (CPU work + transfers), before overlap
    link_bytes: float          # host<->device bytes per device per step, both directions
    saved_bytes: float         # device bytes saved per device
    host_bytes: float          # host bytes per device
    overlap_s: float           # part of host_s hidden behind device compute
    exposed_s: float           # step time added
    detail: dict = field(default_factory=dict)


def host_bandwidth(cluster, sharers: int) -> float:
    """Streaming host-memory bytes/s available to one of `sharers` devices of a node."""
    return cluster.host_mem_bandwidth * cluster.memory_efficiency / max(1, sharers)


def _sync_link(dp: int, tp: int, cluster) -> str:
    return "inter" if dp * tp > cluster.gpus_per_node else "intra"


def embedding_host_cost(tables, cluster, settings, *, dp=1, tp=1, zero=0, micro_batches=1,
                        compute_s=0.0, sharers=1, device_split=None) -> HostCost:
    """Cost of holding `tables` (list of Table) on the host instead of the device."""
    m = max(1, int(micro_batches))
    ab = settings.act_bytes("float32")
    bw = host_bandwidth(cluster, sharers)
    elems = sum(t.lookups * t.dim for t in tables) / tp          # row elements per micro-batch per device
    t_lookup = elems * (4 + ab) / (bw * GATHER_EFFICIENCY)       # read fp32 rows, write the output
    t_h2d = elems * ab / cluster.h2d_bw
    t_d2h = elems * ab / cluster.h2d_bw                          # gradients of the looked-up rows
    touched = m * elems                                           # upper bound: no duplicate ids
    t_opt = touched * ROW_UPDATE_BYTES / (bw * GATHER_EFFICIENCY)   # random rows, like the lookup
    # Replicas exchange their sparse row gradients (fp32 values + int64 row index per row).
    idx = sum(t.lookups for t in tables) / tp * m * 8
    t_sync = collective_time("all_gather", dp * (touched * 4 + idx), dp, "inter" if dp > 1 else "intra",
                             cluster) if dp > 1 else 0.0
    fwd = t_lookup + t_h2d
    host_s = m * (fwd + t_d2h) + t_opt + t_sync
    exposed = host_s              # as emitted: in series with the micro-batches' compute (see above)
    saved = 0.0
    host_bytes = 0.0
    for t in tables:
        # what leaves the device is the table as the stage priced it there: split over tp only where
        # the searched layout shards it (`device_split`: table -> ways), else whole on every tp rank
        ways = (device_split or {}).get(t.name, tp)
        # a sparse table on the device is outside DDP/FSDP/ZeRO (emit.sparse): whole weights and
        # moments, the touched rows as its gradient, never gathered -- all of which the host frees
        st = sparse_table_state_bytes(t.rows * t.dim / ways, (t.lookups * t.dim / ways, t.lookups), m, settings)
        saved += st["params"] + st["grads"] + st["optimizer"]
        host_bytes += t.rows * t.dim / tp * HOST_TABLE_BYTES
    host_bytes += touched * 4 + 2 * elems * ab                    # sparse grad buffer + staging
    detail = {"lookup_s": m * t_lookup, "h2d_s": m * t_h2d, "d2h_s": m * t_d2h, "optimizer_s": t_opt,
              "sync_s": t_sync, "touched_elements": touched,
              "tables": {t.name: {"rows": t.rows, "dim": t.dim, "lookups": t.lookups, "optimizer_kind": t.kind}
                         for t in sorted(tables, key=lambda x: x.name)}}
    return HostCost(host_s, m * elems * ab * 2, saved, host_bytes, max(0.0, host_s - exposed), exposed, detail)


def optimizer_offload_cost(n_params, cluster, settings, *, groups=1, largest_group=None, dp=1, tp=1,
                           zero=0, micro_batches=1, compute_s=0.0, sharers=1, local_params=None,
                           largest_param=None, streamed=True) -> HostCost:
    """Cost of ZeRO-Offload for `n_params` parameters of a stage (before tp sharding), split into
    `groups` parameter groups (blocks) of at most `largest_group` parameters.  `local_params`: what one
    device holds of them under the stage's layout (default n_params / tp: every one split over tp).
    `streamed` False: gradients reach the host after backward even at dp = 1 (DualPipeV: torch's
    weight-gradient actions fire no accumulate hook, sapp/emit/steps/optimizers._offload_overlap)."""
    m = max(1, int(micro_batches))
    G = max(1, int(groups))
    local = n_params / tp if local_params is None else local_params     # what the device holds
    shard = local / dp if (zero >= 1 and dp > 1) else local  # what its CPU updates
    g, w = settings.grad_bytes, settings.weight_bytes
    bw = host_bandwidth(cluster, sharers)
    host_flops = cluster.host_flops / max(1, sharers)
    t_d2h = shard * g / cluster.h2d_bw                          # per micro-batch
    t_acc = shard * (4 + g + 4) / bw                            # fp32 accumulate: read acc + grad, write acc
    adam_bytes = ADAM_BYTES_FP32 + (w if settings.mixed else 0)
    t_adam = max(shard * adam_bytes / bw, shard * ADAM_FLOPS / host_flops)
    t_h2d = shard * w / cluster.h2d_bw
    t_sync = 0.0          # gradients sync once per step either way (dp = 1: none; dp > 1: before the copy)
    st = model_state_bytes(local, dp, zero, settings)
    if dp > 1 or not streamed:
        # as emitted: after backward and the dp sync, one copy of the (synced) gradients, CPU Adam,
        # the weights back, in sequence; the gradients stay on the device.  DeepSpeed's ZeRO-1/2/3
        # offload_optimizer (priced with this too) copies the gradient partition during each backward and
        # frees it on the device: sapp/engines/deepspeed.offload_note says so on import
        exposed = host_s = t_d2h + t_adam + t_h2d
        m_copies, saved, bucket = 1, st["optimizer"], 0.0
        in_flight = 0.0
    else:
        c_mb = compute_s / m
        b_last = BWD_SHARE * c_mb
        early = (m - 1) * max(0.0, max(t_d2h, t_acc) - OVERLAP * c_mb)
        # one worker thread runs a group's CPU Adam and then its weight copy (the copy back leaves
        # from the thread that updated the master), so the two add; only backward hides them
        worker = t_adam + t_h2d
        if cluster.async_launch:
            # a GPU: each gradient's copy leaves from its hook on the backward's thread and stream,
            # so backward is longer by about the copies' link time (bench/gpu_offload.py on an H200:
            # gpt3-1.3b's backward 0.23 -> 0.36 s, 0.10 s of copies); the worker overlaps the rest
            last = t_d2h + max(0.0, worker - OVERLAP * b_last) + worker / G
        else:
            # a CPU device: the hook copies, steps and copies back inline in backward: nothing hides
            last = t_d2h + worker
        exposed = early + last
        host_s = m * t_d2h + (m - 1) * t_acc + t_adam + t_h2d
        # as emitted (OffloadAdam overlap, sapp/emit/host/host.py): each parameter's gradient is copied to
        # the host and freed in its own post-accumulate hook, every micro-batch: the device keeps no
        # gradients.  The one in flight (at most the largest parameter's, `largest_param`) lives in
        # backward, after the activation peak and as its node's saved inputs go, so it adds nothing to
        # the peak (measured: tests/test_hf_emit.py::test_hf_llama3_interleaved_layout_runs_as_priced);
        # it is reported, not counted.  Without `largest_param`: two groups, as a bound.
        if largest_param:
            bucket = 0.0
            in_flight = min(st["grads"], largest_param / tp * g)
        else:
            biggest = (largest_group if largest_group else local / G * tp) / tp
            bucket = in_flight = min(st["grads"], 2 * biggest * g)
        saved = st["optimizer"] + st["grads"] - bucket
        m_copies = m
    host_bytes = shard * HOST_OFFLOAD_BYTES
    detail = {"d2h_s": m_copies * t_d2h, "accumulate_s": (m_copies - 1) * t_acc, "optimizer_s": t_adam,
              "h2d_s": t_h2d, "sync_s": t_sync, "params_on_host": shard, "groups": G, "grad_bucket_bytes": bucket,
              "grad_in_flight_bytes": in_flight,
              "pipelined": dp == 1}
    return HostCost(host_s, m_copies * shard * g + shard * w, saved, host_bytes, max(0.0, host_s - exposed),
                    exposed, detail)
