"""Roofline compute time, alpha-beta ring collectives, model-state bytes (REFERENCE.md section 2).

One operator's time: compute_scale x combine(max(flops / (peak·efficiency), bytes / stream_bw(bytes),
randoms / rng(randoms), elements / op_rate[op]), launches x op_overhead), where combine is + on a
serial device (CPU eager) and max on an asynchronous one (GPU).  A memory-bound op streams at the
measured `mem_bw_curve` at the bytes it moves where the cluster has one (small ops run from cache,
several times DRAM's rate), else at mem_bandwidth x memory_efficiency.

Compute efficiency by kernel (one model for every plan and runtime profile, held by the cluster):
  - a fused attention kernel (SDPA / flash) runs at its own fraction of peak
    (`Cluster.attention_efficiency`, `attention_bwd_efficiency`; the Hopper presets carry cuDNN's
    published figures, sapp/cluster/__init__.py), counting FLOPs as nodes.time_flops does (causal half,
    backward 2.5x forward);
  - dense GEMMs (matmul, conv) on the *summed* roofline where `gemm_memory_overlap` is 0 (the GPU
    presets): arithmetic at compute_efficiency plus operand and output traffic at memory_efficiency,
    an efficiency of compute_efficiency·AI / (AI + ridge) with AI = FLOPs / bytes and ridge = peak /
    bandwidth: larger GEMMs reach more of peak, as Megatron-LM's weak-scaling README describes (a
    model choice, not a measurement by shape).  `gemm_memory_overlap` 1 (CPU, calibrated clusters,
    whose measured efficiency already folds the traffic in) is the plain roofline's max.
The joint search's analytic bound divides by the largest efficiency the cluster names, so it stays a
lower bound."""
from __future__ import annotations

import functools
import math

from ..cluster import curve_rate
from ..errors import SappError
from .dtypes import op_name
from .torchtitan import attention_scale, flash_kernel

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")


def compute_time(flops: float, nbytes: float, cluster, launches: float = 0.0, randoms: float = 0.0,
                 floor: float = 0.0, efficiency: float = 0.0, overlap: float = 1.0) -> float:
    """Roofline: the slower of the arithmetic, the memory traffic (at the cluster's efficiencies)
    and the drawing of `randoms` random numbers (`cluster.rng_rate`, e.g. a dropout mask), plus the
    host dispatch of `launches` operator launches (`cluster.op_overhead` each).

    How dispatch combines with the roofline depends on who does the work (`cluster.async_launch`):
      - asynchronous (GPUs): the host enqueues kernels and runs ahead of the device, so dispatch is
        hidden behind the kernel unless the kernel is shorter: max(roofline, dispatch).  Taken per
        op this is an upper bound of the sequence's max(sum kernels, sum dispatch) - the host's
        run-ahead can hide a short kernel's launch behind a long neighbour's - but it keeps the
        cost additive over operators, which the searches need;
      - serial (CPU eager): the thread that dispatches the op then computes it: roofline + dispatch.
    `floor`: seconds the op takes at least before dispatch (a measured element rate, `op_floor`).
    `efficiency`: the fraction of peak this kernel's arithmetic reaches (`kernel_efficiency`); 0 =
    the cluster's compute_efficiency.
    The result is scaled by `cluster.compute_scale` (measured framework overhead, 1 by default)."""
    eff = efficiency if efficiency > 0 else cluster.compute_efficiency
    t_c = flops / (cluster.peak_flops * eff) if flops > 0 else 0.0
    t_m = nbytes / stream_bandwidth(nbytes, cluster) if nbytes > 0 else 0.0
    # `overlap`: the share of the shorter of the two limits hidden behind the longer (1 = the plain
    # roofline's max; 0 = their sum: `gemm_time_overlap`)
    t = (t_c if t_c > t_m else t_m) + (1.0 - overlap) * (t_m if t_c > t_m else t_c)
    if randoms > 0:
        rate = curve_rate(getattr(cluster, "rng_curve", ()), randoms, getattr(cluster, "rng_rate", float("inf")))
        t = max(t, randoms / rate)
    if floor > t:
        t = floor
    overhead = getattr(cluster, "op_overhead", 0.0) or 0.0
    if launches > 0 and overhead > 0:
        host = launches * overhead
        if getattr(cluster, "async_launch", True):
            t = t if t > host else host
        else:
            t = t + host
    return t * getattr(cluster, "compute_scale", 1.0)


def kernel_efficiency(kind: str, backward: bool, cluster, settings=None) -> float:
    """Fraction of peak the arithmetic of an op of `kind` reaches: a fused attention kernel its
    measured figure (`Cluster.attention_efficiency` / `attention_bwd_efficiency`, 0 = unset; under
    the "torchtitan" profile FlashAttention's own (`flash_attention_*`), under "torchtitan-2412" scaled to
    the FlashAttention-2 kernel torch's SDPA ran then, costmodel.torchtitan),
    every other op the cluster's compute_efficiency.  The joint search's analytic bound prices the work at
    the largest of these a cluster names (search/joint/context.py), so it stays a lower bound."""
    if kind == "attention":
        e = getattr(cluster, "attention_bwd_efficiency" if backward else "attention_efficiency", 0.0) or 0.0
        if flash_kernel(settings):
            e = getattr(cluster, "flash_attention_bwd_efficiency" if backward else "flash_attention_efficiency",
                        0.0) or e
        if e > 0:
            return e * attention_scale(backward, settings)
    return cluster.compute_efficiency


def stream_bandwidth(nbytes: float, cluster) -> float:
    """Bytes/s an op moving `nbytes` streams at: the measured size curve where the cluster has one
    (small tensors stay in cache), else the memory bandwidth at the memory efficiency."""
    curve = getattr(cluster, "mem_bw_curve", ())
    if curve:
        return curve_rate(curve, nbytes, 0.0)
    return cluster.mem_bandwidth * cluster.memory_efficiency


@functools.lru_cache(maxsize=4096)
def op_short_name(target: str) -> str:
    """The key `Cluster.op_rates` uses: 'aten.native_layer_norm.default' -> 'layer_norm',
    'aten._softmax.default' -> 'softmax', 'aten.add_.Tensor' -> 'add'."""
    base = op_name(target).strip("_")
    return base[len("native_"):] if base.startswith("native_") else base


@functools.lru_cache(maxsize=16)
def _rates(op_rates: tuple) -> dict:
    return {name: (f, b) for name, f, b in op_rates}


def op_floor(target: str, elements: float, cluster) -> tuple:
    """(forward, backward) seconds an op of `target` over `elements` takes at least by the cluster's
    measured element rates (`Cluster.op_rates`); (0, 0) when the op is not in the table."""
    table = getattr(cluster, "op_rates", ())
    if not table or elements <= 0:
        return 0.0, 0.0
    r = _rates(table).get(op_short_name(target))
    if r is None:
        return 0.0, 0.0
    return elements / r[0], elements / r[1]


def link_params(link: str, cluster):
    if link == "intra":
        return cluster.intra_latency, cluster.intra_bw
    if link == "inter":
        return cluster.inter_latency, cluster.inter_bw
    raise SappError(f"link must be 'intra' or 'inter', got {link!r}")


def _alpha_beta(kind: str, link: str, cluster) -> tuple:
    """(alpha, beta) of `kind` on `link`: the calibrated fit of that collective inside a node where
    the cluster has one, else the link's figures."""
    if link == "intra" and getattr(cluster, "collective_fits", ()):
        fit = _rates(cluster.collective_fits).get(kind)
        if fit is not None:
            return fit
    return link_params(link, cluster)


def collective_time(kind: str, nbytes: float, n: int, link: str, cluster) -> float:
    """Ring alpha-beta time of one collective over `n` ranks.  `nbytes` is the full buffer for
    all_reduce / all_gather (output) / reduce_scatter (input); the per-rank send buffer for
    all_to_all; the message for p2p."""
    if kind not in COLLECTIVES:
        raise SappError(f"unknown collective {kind!r}; use one of {', '.join(COLLECTIVES)}")
    alpha, beta = _alpha_beta(kind, link, cluster)
    if kind == "p2p":
        return alpha + nbytes / beta if nbytes > 0 else 0.0
    if n <= 1 or nbytes <= 0:
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / beta
    return (n - 1) * alpha + (n - 1) / n * nbytes / beta


def scalar_allreduce_time(n: int, link: str, cluster) -> float:
    """One all-reduce of a few bytes (a loss) over `n` ranks: latency-bound, and libraries run it as
    a tree (NCCL) or recursive doubling rather than a ring, so ceil(log2 n) hops of the link's alpha
    (gloo, 2 CPU processes: 0.8 ms measured in a step against an 0.87 ms fitted alpha)."""
    if n <= 1:
        return 0.0
    return math.ceil(math.log2(n)) * _alpha_beta("all_reduce", link, cluster)[0]


def staging_copy_time(nbytes: float, n: int, cluster) -> float:
    """Local memory traffic of the flat-buffer staging around one sharded-data-parallel collective
    (FSDP2 / ZeRO-3 style) of a `nbytes` full buffer over `n` ranks.  An all-gather copies this
    rank's shard into the flat send buffer (read + write nbytes/n) and then the gathered buffer out
    into the separate parameter tensors (read + write nbytes); a reduce-scatter mirrors it
    (gradients concatenated into the flat buffer, the reduced shard copied out).  Memory-bound:
    2·nbytes·(1 + 1/n) at the DRAM rate: linear in the bytes, so the sum over a unit's parameters is
    the unit's flat buffer (costmodel.gradsync adds it up per parameter in the sharding search and
    per unit in the joint search: one function for both), as for flat_allreduce_staging_time.
    Negligible next to a network hop on GPUs; on a CPU, where "communication" is a memcpy too, it
    is the same order as the collective itself."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    traffic = 2.0 * nbytes * (1.0 + 1.0 / n)
    return traffic / (cluster.mem_bandwidth * cluster.memory_efficiency)


def flat_allreduce_staging_time(nbytes: float, cluster) -> float:
    """Local memory traffic around one all-reduce of `nbytes` of gradients through a flat buffer on a
    serial device (emit/dp/wrap.GradAllReduce): the gradients concatenated in, the sum divided by
    the group size in place, the mean copied back out - three passes that each read and write
    `nbytes`.  They run after a backward that swept the caches, over one buffer of the whole stage's
    gradients, so at the DRAM rate whatever share of them a caller prices (the pipeline profile
    prices a unit at a time; at the cache rate of a unit's size the mlp's 16.7 MB came to 1.8 ms).
    Measured in a 2-process step on this 2-core CPU: 3.3 + 1.9 + 3.5 ms around a 16.5 ms gloo
    all-reduce of 16.7 MB, 11.5 GB/s against a 13 GB/s copy rate."""
    if nbytes <= 0:
        return 0.0
    return 3.0 * 2.0 * nbytes / (cluster.mem_bandwidth * cluster.memory_efficiency)


def sparse_table_state_bytes(n_params: float, sparse, samples: float, settings) -> dict:
    """Per-device bytes of a sparse-gradient embedding table (nn.Embedding(sparse=True)) kept on the
    device: the emitter keeps it out of DDP/FSDP/ZeRO (they take no sparse gradients; emit.sparse), so
    weights and SparseAdam's dense moments are whole at every ZeRO stage, and its gradient is the rows
    `samples` samples touch (values + int64 row indices), never more than the dense table.
    `sparse`: (elements, rows) of gradient per sample (gradsync.sparse_gradient)."""
    elems, rows = sparse
    grads = min(n_params * settings.grad_bytes, samples * (elems * settings.grad_bytes + rows * 8))
    return {"params": settings.weight_bytes * n_params, "grads": grads,
            "optimizer": settings.optimizer_bytes * n_params}


def model_state_bytes(n_params: float, dp: int, zero: int, settings) -> dict:
    """Per-device bytes of weights, gradients and optimizer state for `n_params` (already divided by
    tensor sharding) when the gradient-sync group has `dp` ranks and ZeRO stage `zero` is used."""
    w, g, k = settings.weight_bytes, settings.grad_bytes, settings.optimizer_bytes
    dp = max(1, int(dp))
    params, grads, opt = w * n_params, g * n_params, k * n_params
    if zero >= 1:
        opt /= dp
    if zero >= 2:
        grads /= dp
    if zero >= 3:
        params /= dp
    return {"params": params, "grads": grads, "optimizer": opt}
