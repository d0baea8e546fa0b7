"""Gradient synchronisation and ZeRO-3 parameter gathers: the one pricing every search uses.

The emitted runtimes sync gradients in buckets (DDP's buckets, one flat all-reduce on a serial device
or under TP/pipelines, one FSDP2 group per block).  A bucket's collective pays its latency once and
its bandwidth per byte, so its time splits into
  - a bandwidth part, linear in the bytes and therefore additive over parameters (`param_sync`):
    what the sharding searches add up operator by operator (`node_cost`), and what the joint
    search's stage profile adds up unit by unit (`bucketed_sync`);
  - a latency part per bucket, one per (group size, link) (`sync_latency`), which the joint search
    pays once per stage;
plus FSDP2's runtime cost on a serial device: per parameter tensor (additive, in `param_sync`) and
per unit (in `bucketed_sync`).  A sparse-gradient embedding table is synced by its own all-gather of
the touched rows (`sparse_sync_time`), latency included.  Pure: no torch, no I/O."""
from __future__ import annotations

from .primitives import _alpha_beta, collective_time, flat_allreduce_staging_time, staging_copy_time
from .torchtitan import fsdp_copy_bytes


def grad_sync_group(strategy, mesh, param_dims):
    """(size, link) of a parameter's gradient-sync group: the levels where the op splits a dim the
    parameter lacks (its gradient is Partial there); the link is the slowest one crossed."""
    n, link = 1, "intra"
    for d, lv in zip(strategy, mesh.levels):
        if d is not None and d not in param_dims:
            n *= lv.size
            if lv.link == "inter":
                link = "inter"
    return n, link


def grad_sync_times(gb, wb, n, link, cluster, zero, staging=True) -> tuple:
    """(gradient sync s per step, parameter all-gather s per forward or backward pass) of one bucket
    of `gb` gradient and `wb` weight bytes over a group of `n` on `link`, latency included, as the
    emitted runtime does it: ZeRO-0 all-reduces (on a serial device through one flat buffer,
    emit/dp/wrap.GradAllReduce); ZeRO-1/2 reduce-scatter then all-gather the update; ZeRO-3
    gathers the weights before forward and again before backward.  ZeRO-2/3 (FSDP2) stage every
    collective through flat buffers (`staging` False: the caller prices those copies itself)."""
    if zero == 0:
        sync = collective_time("all_reduce", gb, n, link, cluster)
        if not getattr(cluster, "async_launch", True) and n > 1:
            sync += flat_allreduce_staging_time(gb, cluster)
        return sync, 0.0
    stage = staging_copy_time if staging else (lambda *a: 0.0)
    sync = collective_time("reduce_scatter", gb, n, link, cluster)
    if zero >= 2:
        sync += stage(gb, n, cluster)
    if zero < 3:
        sync += collective_time("all_gather", wb, n, link, cluster)
        if zero == 2:
            sync += stage(wb, n, cluster)
        return sync, 0.0
    return sync, collective_time("all_gather", wb, n, link, cluster) + stage(wb, n, cluster)


def sync_latency(n, link, cluster, zero) -> tuple:
    """(sync latency per step, gather latency per pass) of one bucket: the alpha terms of the ring
    collectives `grad_sync_times` runs (an all-reduce is 2(n-1) hops, a reduce-scatter or an
    all-gather n-1 each)."""
    if n <= 1:
        return 0.0, 0.0
    alpha = lambda kind: _alpha_beta(kind, link, cluster)[0]  # noqa: E731
    if zero == 0:
        return 2 * (n - 1) * alpha("all_reduce"), 0.0
    if zero < 3:
        return (n - 1) * (alpha("reduce_scatter") + alpha("all_gather")), 0.0
    return (n - 1) * alpha("reduce_scatter"), (n - 1) * alpha("all_gather")


def param_sync(numel, n, link, cluster, settings) -> tuple:
    """(sync s per step, gather s per pass) of one dense parameter of `numel` local elements whose
    gradient syncs over a group of `n` on `link`: the bandwidth parts of its bucket's collectives
    (latency is the bucket's, `sync_latency`) and, for FSDP2 on a serial device, its per-tensor
    runtime.  Additive over parameters.  Before grad_sync_overlap."""
    if n <= 1 or numel <= 0:
        return 0.0, 0.0
    zero = settings.zero
    tt = fsdp_copy_bytes(numel, n, settings) if zero >= 2 else {}
    sync, gather = grad_sync_times(numel * settings.reduce_bytes, numel * settings.weight_bytes, n, link, cluster, zero,
                                   staging=not tt)
    lat_s, lat_g = sync_latency(n, link, cluster, zero)
    sync, gather = sync - lat_s, gather - lat_g
    if tt:      # FSDP2's copies on its own streams as torchtitan runs it (costmodel.torchtitan)
        rate = cluster.mem_bandwidth * cluster.memory_efficiency
        sync += tt["rs_out"] / rate
        if zero == 3:
            gather += tt["gather_in"] / rate
        else:
            sync += tt["gather_in"] / rate
    if zero >= 2 and not getattr(cluster, "async_launch", True):
        sync += getattr(cluster, "fsdp_tensor_overhead", 0.0)
    return sync, gather


def sparse_gradient(node, factors, per_rank=1.0):
    """(elements, rows) of gradient a sparse-gradient embedding table (nn.Embedding(sparse=True))
    gets per `per_rank` samples of its node's batch on one rank, under the split `factors` of its
    op dims; None for any other op."""
    if node.kind != "embedding" or not node.extra.get("sparse") or not node.out.shape:
        return None
    elems = float(node.out.numel)
    for d in set(node.out.dims):
        if d in factors:
            elems /= factors[d]
    dim = max(float(node.out.shape[-1]) / factors.get(node.out.dims[-1], 1), 1.0)
    return elems / per_rank, elems / dim / per_rank


def sparse_sync_time(numel, k, link, sparse, samples, cluster, settings):
    """Gradient sync of a sparse-gradient table: torch all-gathers every rank's (indices, rows)
    instead of all-reducing the table, which is far cheaper while a step touches few rows; never
    more than the dense all-reduce.  `sparse`: (elements, rows) of gradient per sample per rank."""
    elems, rows = sparse
    local = samples * (elems * settings.reduce_bytes + rows * 8)          # values + int64 row indices
    gathered = collective_time("all_gather", k * local, k, link, cluster)
    return min(gathered, collective_time("all_reduce", numel * settings.reduce_bytes, k, link, cluster))


def bucketed_sync(params, cluster, settings, samples=1.0):
    """Gradient sync and ZeRO-3 gathers of one FSDP unit / block's parameters `params`
    ([(local numel, group size, link, trainable, sparse)]): the sum of `param_sync` over the dense
    ones, the sparse tables' own syncs, FSDP2's per-unit runtime (ZeRO-2/3 on a serial device), and
    the buckets' latencies.  Returns (sync bandwidth s per step, sync latency s per step, gather s
    per pass, latency included: one gather per unit and pass); the sync parts after
    grad_sync_overlap.  The caller pays the sync latency once per stage (one bucket per group)."""
    sync = sparse = gather = lat = 0.0
    buckets, tensors = set(), 0
    for numel, k, link, trainable, sp in params:
        if not trainable or k <= 1:
            continue
        if sp is not None:          # `samples`: samples per rank per step (rows touched accumulate)
            sparse += sparse_sync_time(numel, k, link, sp, samples, cluster, settings)
            continue
        s, g = param_sync(numel, k, link, cluster, settings)
        sync += s
        gather += g
        buckets.add((k, link))
        tensors += 1
    for k, link in sorted(buckets):
        ls, lg = sync_latency(k, link, cluster, settings.zero)
        lat += ls
        gather += lg
    if settings.zero >= 2 and buckets and not getattr(cluster, "async_launch", True):
        sync += getattr(cluster, "fsdp_unit_overhead", 0.0)
    keep = 1.0 - settings.grad_sync_overlap
    return (sync + sparse) * keep, lat * keep, gather


def fsdp_exposed_copies(params, cluster, settings) -> tuple:
    """(forward s per micro-batch, backward s per micro-batch, s per step) of the FSDP2 copies a
    torchtitan profile runs on the compute stream for one unit's `params` (as `bucketed_sync` takes
    them; costmodel.torchtitan.fsdp_copy_bytes): the all-gather copy-out wherever the profile prices the
    all-gather (ZeRO-3: every forward and backward; ZeRO-2: once a step) and the reduce-scatter copy-in
    once a step, with the gradient sync (the last micro-batch's backward: torch.distributed.pipelining
    turns the sync off before it).  Part of the stage's time, never hidden by the prefetch or behind
    backward; (0, 0, 0) for another runtime or below ZeRO-2."""
    zero = settings.zero
    if zero < 2 or not settings.torchtitan:
        return 0.0, 0.0, 0.0
    out = step = 0.0
    for numel, k, _link, trainable, sp in params:
        if not trainable or k <= 1 or sp is not None:
            continue
        tt = fsdp_copy_bytes(numel, k, settings)
        out += tt["copy_out"]
        step += tt["rs_in"]
    rate = cluster.mem_bandwidth * cluster.memory_efficiency
    if zero == 3:
        return out / rate, out / rate, step / rate
    return 0.0, 0.0, (out + step) / rate


# ---- what the runtime overlaps ---------------------------------------------------------------------
OVERLAP_RULES = ("none", "ddp-buckets", "fsdp-units")


def overlap_rule(cluster, zero, pp, tp, runtime="eager") -> str:
    """How the emitted runtime (sapp/emit/dp/wrap.wrap_dp) overlaps a stage's gradient sync with its
    backward pass on `cluster`, one stated rule per cluster kind, not a knob:
      - "none": a serial device (CPU eager, `async_launch` False: one stream, the flat all-reduce
        runs after backward), or tensor parallelism / a pipeline under ZeRO-0/1 (DDP cannot run
        there; one flat all-reduce after the last backward);
      - "ddp-buckets": ZeRO-0/1 with neither TP nor a pipeline on an asynchronous device: DDP
        all-reduces 25 MB buckets on its communication stream as backward fills them;
      - "fsdp-units": ZeRO-2/3 (FSDP2) on an asynchronous device: each unit's reduce-scatter runs
        on FSDP2's stream while backward goes on with the next unit; ZeRO-3's all-gathers are
        prefetched one unit ahead, forward and backward (`fsdp_prefetch_hidden`): only a stage's
        first gather of each pass is exposed whole, the others beyond their neighbour's compute.
    The "fused" runtime profile prices Megatron-Core (costmodel/settings.py), whose distributed
    optimizer overlaps its bucketed gradient reduce-scatter with backward (--overlap-grad-reduce)
    under tensor and pipeline parallelism too: "megatron-buckets" for ZeRO-0/1 there.
    Under every overlapping rule what the last backward cannot hide stays exposed
    (`exposed_grad_sync`)."""
    if not getattr(cluster, "async_launch", True):
        return "none"
    if runtime in ("fused", "fused+tp-overlap") and zero <= 1:
        return "megatron-buckets"
    if zero >= 2:
        return "fsdp-units"
    if pp == 1 and tp == 1:
        return "ddp-buckets"
    return "none"


def fsdp_prefetch_hidden(gathers, computes) -> list:
    """Seconds of each unit's ZeRO-3 all-gather that FSDP2's prefetch hides, units in the order a pass
    runs them (forward: forward order; backward: reversed).  FSDP2 issues the all-gather of unit i+1 on
    its own stream when unit i starts computing (implicit forward prefetch; in backward, a unit's
    pre-backward prefetches the next one to run) and holds one unit in flight, so unit i+1 starts at
    max(end of unit i's compute, end of its own gather) with its gather begun at unit i's start:
    start_{i+1} = start_i + max(c_i, g_{i+1}).  The pass then takes g_0 + sum_i max(c_i, g_{i+1}) +
    c_last, i.e. every gather but the first is hidden by min(g_{i+1}, c_i): exactly, not as a bound.
    The first unit's gather is exposed (hidden[0] = 0).  Assumed: the gather stream and the
    reduce-scatter stream share no bandwidth with each other or with compute (FSDP2's separate streams
    on a full-duplex NVLink/NIC), and a CPU (serial device) overlaps nothing (rule "none").
    Pure, O(units)."""
    out = []
    for i, g in enumerate(gathers):
        out.append(min(g, computes[i - 1]) if i > 0 else 0.0)
    return out


DDP_BUCKET_BYTES = 25 * 2 ** 20      # torch DDP's bucket_cap_mb default


def exposed_grad_sync(rule, sync_s, latency_s, backward_s, last_unit_s=0.0, grad_bytes=0.0, forward_s=None,
                      zero=None) -> float:
    """Seconds of a stage's gradient sync (`sync_s` bandwidth, `latency_s` latency: the priced
    buckets, `bucketed_sync`) left after what `rule` overlaps with the step's last backward pass
    (`backward_s`: gradients are synced on the last micro-batch only).  The last bucket starts only
    when backward ends: FSDP2's is the stage's first unit and its root (glue) parameters
    (`last_unit_s`), DDP's the first parameters' bucket: at least the 25 MB cap's share of the
    gradients and never less than that first unit's own (a tensor is never split between buckets).
    Everything else runs under backward, so the exposed time is max(last bucket, sync - backward).
    "megatron-buckets" at ZeRO-1 (`zero`, with the stage's first micro-batch `forward_s`): the
    distributed optimizer's reduce-scatter and its all-gather of the updated parameters move the same
    bytes over the same ring (half the priced sync each); --overlap-grad-reduce hides the first behind
    the last backward and --overlap-param-gather the second behind the next step's first forward,
    bucket by bucket, each leaving its first-needed bucket exposed (both flags as the Megatron-LM
    README's published runs set them)."""
    total = sync_s + latency_s
    if rule == "none" or total <= 0:
        return total
    if rule == "megatron-buckets" and zero == 1 and forward_s is not None:
        half = exposed_grad_sync(rule, sync_s / 2, latency_s / 2, backward_s, last_unit_s / 2, grad_bytes)
        return half + exposed_grad_sync(rule, sync_s / 2, latency_s / 2, forward_s, last_unit_s / 2, grad_bytes)
    last = last_unit_s
    if rule in ("ddp-buckets", "megatron-buckets") and grad_bytes > 0:
        last = max(last, sync_s * min(1.0, DDP_BUCKET_BYTES / grad_bytes))
    last = min(sync_s, last) + latency_s
    return max(last, total - backward_s)
