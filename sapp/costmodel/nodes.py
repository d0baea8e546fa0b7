"""Per-operator costs: the strategies an op may take, and its compute / gradient-sync / model-state
cost under one strategy."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..errors import SappError
from .dtypes import fp8_share_of, fusion_of, operand_bytes, out_bytes
from .fp8 import fp8_times, is_fp8_gemm
from .grads import carries_grad
from .gradsync import grad_sync_group, grad_sync_times, param_sync, sparse_gradient, sparse_sync_time  # noqa: F401
from .primitives import compute_time, kernel_efficiency, model_state_bytes, op_floor, sparse_table_state_bytes
from .torchtitan import pass_bytes

# Ops whose backward does two GEMM-like passes (input grad and weight/second-operand grad): backward
# FLOPs = 2x forward.  Element-wise / norm / softmax backward does about as much arithmetic as the
# forward but touches twice the memory (grad-out + saved tensor in, grad-in out): backward FLOPs =
# 1x forward, bytes = 2x forward for every op.
MATMUL_LIKE = ("matmul", "conv", "attention", "embedding")
# A fused attention operator (SDPA: flash attention on GPUs) saves q, k, v and its output, not the s²
# scores, so its backward first recomputes q·kᵀ and then runs the four gradient GEMMs (dV, dP, dQ,
# dK): 5 score-sized GEMMs against the forward's 2, backward FLOPs = 2.5x forward (FlashAttention-2's
# count).  A causal kernel skips the key blocks above the diagonal: it runs about half the score
# FLOPs in both passes.  Model FLOPs (MFU) keep counting the whole s², as Megatron's formula does.
ATTENTION_BWD = 2.5
# Dense GEMM kernels (cuBLAS / cuDNN): their time follows the cluster's GEMM roofline
# (`Cluster.gemm_memory_overlap`).  A fused attention kernel has its own measured efficiency instead.
GEMM_KINDS = ("matmul", "conv")
CAUSAL_WORK = 0.5


def time_flops(node, flops) -> tuple:
    """(forward, backward) FLOPs the kernels of `node` execute for `flops` forward model FLOPs."""
    if node.kind == "attention":
        f = flops * (CAUSAL_WORK if node.extra.get("causal") else 1.0)
        return f, f * ATTENTION_BWD
    return flops, flops * (2 if node.kind in MATMUL_LIKE else 1)


def launches_of(kind: str, backward: bool, async_launch: bool) -> int:
    """Operator launches an op of `kind` costs in the forward or the backward pass.
    Forward: one.  Backward: one per gradient kernel - two for GEMM-like ops (input grad and
    weight/second-operand grad), one otherwise.  A view launches no kernel: on an asynchronous
    device its (small) dispatch hides behind device work, so it counts 0; in serial eager the
    dispatch itself is the cost, so it counts like any op.  Inputs are not operators."""
    if kind == "input":
        return 0
    if kind == "view" and async_launch:
        return 0
    if backward and kind in MATMUL_LIKE:
        return 2
    return 1


@dataclass
class NodeCost:
    fwd_s: float = 0.0            # forward compute at the local shard size
    bwd_s: float = 0.0            # backward compute
    grad_sync_s: float = 0.0      # exposed gradient synchronisation (after grad_sync_overlap)
    param_bytes: float = 0.0      # per device: weights
    grad_bytes: float = 0.0       # per device: gradients
    optimizer_bytes: float = 0.0  # per device: optimizer states (incl. fp32 master in mixed precision)
    fwd_comm_s: float = 0.0       # forward communication inside the op (ZeRO-3 parameter gathers)
    bwd_comm_s: float = 0.0       # backward communication inside the op (ZeRO-3 parameter gathers)
    grad_sync_total_s: float = 0.0  # gradient synchronisation before overlap

    @property
    def state_bytes(self) -> float:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def compute_s(self) -> float:
        return self.fwd_s + self.bwd_s

    @property
    def comm_s(self) -> float:
        return self.grad_sync_s + self.fwd_comm_s + self.bwd_comm_s

    @property
    def time_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.comm_s


def split_factors(strategy, mesh) -> dict:
    """op dim -> product of the level sizes it is split over."""
    f = {}
    for d, lv in zip(strategy, mesh.levels):
        if d is not None:
            f[d] = f.get(d, 1) * lv.size
    return f


def op_strategies(node, mesh, roles=None) -> list:
    """Every per-level tuple for `node`: each entry None or a splittable dim whose size stays
    divisible by the product of the levels assigned to it.  `roles` (per level "dp" | "tp" | None)
    restricts dp levels to batch dims and tp levels to non-batch dims.  The count grows as
    (dims+1)^levels, so use this on small meshes; the recursive search decides level by level."""
    dims = [d for d in node.dims if d.splittable and d.size > 1]
    per_level = []
    for i, lv in enumerate(mesh.levels):
        role = roles[i] if roles else None
        opts = [None]
        for d in dims:
            if (role == "dp" and not d.batch) or (role == "tp" and d.batch):
                continue
            if d.size % lv.size == 0:
                opts.append(d.name)
        per_level.append(opts)
    sizes = {d.name: d.size for d in dims}
    out = []
    for combo in itertools.product(*per_level):
        f = split_factors(combo, mesh)
        if all(sizes[d] % k == 0 for d, k in f.items()):
            out.append(combo)
    return out


def _local_numel(shape, dims, factors):
    n = 1
    for s, d in zip(shape, dims):
        k = factors.get(d, 1) if d is not None else 1
        n *= s / k
    return n


def local_bytes(node, factors, settings) -> float:
    """Forward memory traffic of the op's shard: the captured `bytes`, rescaled to the settings'
    precision (activations at their autocast widths, costmodel.dtypes) and to the shard of every
    operand and of the output.  A view moves nothing (its backward is a view too): it costs only
    its dispatch."""
    if node.kind == "view":
        return 0.0
    # the fused runtime keeps a fused chain's intermediates inside one kernel (costmodel.fusion)
    fin, fout = fusion_of(node)[:2] if settings.fused else ((), False)
    full_cap = full = loc = 0.0
    for i, o in enumerate(node.operands):
        if o.producer is None and o.param is None:
            continue
        if o.param is not None and settings.is_float(o.dtype):
            eb = settings.weight_bytes
        else:
            # an operand autocast casts is copied first (read at its width, written and read cast)
            a, c = operand_bytes(node, i, settings)
            eb = c if a == c else a + 2 * c
        full_cap += o.nbytes
        full += o.numel * eb
        if i not in fin:
            loc += _local_numel(o.shape, o.dims, factors) * eb
    eb = out_bytes(node, settings)
    full_cap += node.out.nbytes
    full += node.out.numel * eb
    if not fout:
        loc += _local_numel(node.out.shape, node.out.dims, factors) * eb
    if node.bytes > 0 and full_cap > 0:
        return node.bytes * (full / full_cap) * (loc / full) if full > 0 else 0.0
    return loc


# Bytes per logit element Megatron-Core's vocab-parallel cross entropy moves
# (megatron/core/tensor_parallel/cross_entropy.py, without --cross-entropy-loss-fusion), pass by pass.
# Forward: the half-precision logits cast to fp32 (read 2, write 4), the row max (read 4), minus the
# max (read 4, write 4), exp in place (read 4, write 4), the row sum (read 4), the division into the
# softmax it saves (read 4, write 4).  Backward: the softmax times the incoming gradient in place
# (read 4, write 4), cast back to the logits' half precision for the output layer (read 4, write 2).
CE_FWD_BYTES, CE_BWD_BYTES = 38, 14


def megatron_cross_entropy_bytes(node, factors, settings):
    """(forward, backward) memory traffic of a cross-entropy loss under the fused runtime profile,
    priced pass by pass as Megatron-Core runs it on this rank's shard of the logits (the vocabulary
    split over tp), plus the targets; None for any other op or runtime (local_bytes prices it)."""
    if not (settings.fused and settings.mixed and node.kind == "loss" and "cross_entropy" in node.target):
        return None
    if not node.operands or node.operands[0].dtype not in ("float32", "float16", "bfloat16") \
            or node.operands[0].param is not None:
        return None
    logits = node.operands[0]
    n = _local_numel(logits.shape, logits.dims, factors)
    rest = sum(_local_numel(o.shape, o.dims, factors) * settings.act_bytes(o.dtype) for o in node.operands[1:])
    return n * CE_FWD_BYTES + rest, n * CE_BWD_BYTES


def _fp8_linear(node, f, ff, fb, cluster, settings, ov) -> tuple:
    """fp8_times of a linear (or an expert grouped GEMM) under the split factors `f`, with the FP8 linears
    sharing its input."""
    def numel(o):
        t = node.out if o is None else o
        return _local_numel(t.shape, t.dims, f)
    return fp8_times(node, numel, ff, fb, cluster, settings, carries_grad(node), ov, fp8_share_of(node))


def node_cost(node, strategy, mesh, cluster, settings, params=None) -> NodeCost:
    """Cost of one op under `strategy`.  `params` optionally maps the parameter names this node
    accounts for to whether they are trainable (a parameter shared by several ops is accounted once,
    by its first user; frozen ones have weights but no gradients/optimizer); default: all of the
    node's parameters, trainable."""
    if len(strategy) != len(mesh.levels):
        raise SappError(f"strategy {strategy} for {node.name} has {len(strategy)} entries but the mesh has "
                        f"{len(mesh.levels)} levels; give one entry per level")
    f = split_factors(strategy, mesh)
    split = 1
    for k in f.values():
        split *= k
    flops = node.flops / split
    nbytes = local_bytes(node, f, settings)
    bwd_bytes = 2 * nbytes
    ce = megatron_cross_entropy_bytes(node, f, settings)
    if ce is None:
        ce = pass_bytes(node, f, settings)          # the torchtitan profile's eager RMSNorm and loss
    if ce is not None:
        nbytes, bwd_bytes = ce
    c = NodeCost()
    if node.kind == "input":
        return c
    async_launch = getattr(cluster, "async_launch", True)
    # dropout draws one random number per output element in forward; backward reuses the mask
    randoms = _local_numel(node.out.shape, node.out.dims, f) if node.kind == "dropout" else 0.0
    floor_f = floor_b = 0.0
    if node.kind not in MATMUL_LIKE and getattr(cluster, "op_rates", ()):
        # measured element rate: elements of the output or, for a reduction such as a loss, the input
        elems = _local_numel(node.out.shape, node.out.dims, f)
        if node.operands:
            o = node.operands[0]
            elems = max(elems, _local_numel(o.shape, o.dims, f))
        floor_f, floor_b = op_floor(node.target, elems, cluster)
    ff, fb = time_flops(node, flops)
    # a node fused into its consumer's kernel launches nothing of its own
    own = 0 if settings.fused and fusion_of(node)[1] else 1
    ov = getattr(cluster, "gemm_memory_overlap", 1.0) if node.kind in GEMM_KINDS else 1.0
    c.fwd_s = compute_time(ff, nbytes, cluster, own * launches_of(node.kind, False, async_launch), randoms, floor_f,
                           efficiency=kernel_efficiency(node.kind, False, cluster, settings), overlap=ov)
    # an op no gradient flows through has no backward node (costmodel.grads)
    c.bwd_s = compute_time(fb, bwd_bytes, cluster,
                           own * launches_of(node.kind, True, async_launch), floor=floor_b,
                           efficiency=kernel_efficiency(node.kind, True, cluster, settings), overlap=ov) if carries_grad(node) else 0.0
    # its GEMMs at the FP8 rate, and the casts (costmodel/fp8.py; the experts' where the engine runs them so)
    if settings.fp8 and is_fp8_gemm(node, settings.fp8):
        c.fwd_s, c.bwd_s, c.param_bytes = _fp8_linear(node, f, ff, fb, cluster, settings, ov)
    seen = set()
    for o in node.operands:
        if o.param is None or o.param in seen:
            continue
        seen.add(o.param)
        if params is not None and o.param not in params:
            continue
        trainable = True if params is None else bool(params[o.param])
        numel = _local_numel(o.shape, o.dims, f)
        if not trainable:
            c.param_bytes += numel * settings.weight_bytes
            continue
        n, link = grad_sync_group(strategy, mesh, o.dims)
        sp = sparse_gradient(node, f)
        # a sparse table stays whole (outside ZeRO) with a gradient of the rows its batch touched
        st = (sparse_table_state_bytes(numel, sp, 1.0, settings) if sp is not None
              else model_state_bytes(numel, n, settings.zero, settings))
        c.param_bytes += st["params"]
        c.grad_bytes += st["grads"]
        c.optimizer_bytes += st["optimizer"]
        if n > 1:
            # the bandwidth parts only: a bucket's latency is paid once per stage (costmodel.gradsync)
            if sp is not None:
                sync, ag = sparse_sync_time(numel, n, link, sp, 1.0, cluster, settings), 0.0
            else:
                sync, ag = param_sync(numel, n, link, cluster, settings)
            c.fwd_comm_s += ag
            c.bwd_comm_s += ag
            c.grad_sync_total_s += sync
            c.grad_sync_s += sync * (1.0 - settings.grad_sync_overlap)
    return c
