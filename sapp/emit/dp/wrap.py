"""Data parallelism for one module (a whole model or one pipeline stage): the gradient sync and the
optimizer a ZeRO stage runs with.

  zero 0, tp=1    DistributedDataParallel over the dp group (CUDA)
  zero 0, tp>1    gradient all-reduce (mean) of the local shards over the dp group after backward
  or pipeline     (DDP refuses DTensor parameters; DDP under a multi-micro-batch pipeline schedule
  or CPU          fails its bucket rebuild in torch 2.13; on CPU overlap only contends for the cores)
  bf16-mixed      DDP bf16_compress_hook / bf16 flat all-reduce; FSDP2
                  MixedPrecisionPolicy(param_dtype=reduce_dtype=bf16)
  zero 1          synchronised as zero 0; the recipe shards the optimizer states itself (dp/zero1.py).
                  Asked for zero 1 under tp>1, wrap_dp runs zero 2
  zero 2          FSDP2 fully_shard(reshard_after_forward=False) per block + root over mesh["dp"]
  zero 3          FSDP2 fully_shard per block + root over mesh["dp"]
  host tables     kept out of DDP / FSDP2 / the all-reduce (sapp/emit/host/)"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from . import batch_stats
from ..tp.dtensor_local import local_grad


def fsdp(module: nn.Module, dp_mesh, reshard: bool, blocks: list, ignored: set = None, mixed: bool = False) -> None:
    """FSDP2: each block its own unit (gathered just in time), then the root for the rest.  `ignored`
    parameters (host tables) stay whole and unmanaged.  `mixed`: gather and reduce in bf16 (fp32
    shards stay the master copy), as bf16-mixed is priced."""
    from torch.distributed.fsdp import fully_shard
    kw = {"ignored_params": set(ignored)} if ignored else {}
    if mixed:
        from torch.distributed.fsdp import MixedPrecisionPolicy
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    mods = dict(module.named_modules())
    # inner units first: a block holding a ModuleList of blocks (diffusers' UNet down blocks) sharded
    # before its inner blocks leaves them nothing but already-sharded parameters ("Cannot concatenate
    # overlapping meshes"); bottom-up, each unit takes the parameters no inner unit took
    for name in sorted(blocks, key=lambda n: -n.count(".")):
        if name in mods and any(True for _ in mods[name].parameters()):
            fully_shard(mods[name], mesh=dp_mesh, reshard_after_forward=reshard, **kw)
    fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard, **kw)


def gloo_dp_group(mesh, device, pp: int, dp: int, tp: int):
    """The dp group for host (CPU) tensors: the mesh's own on gloo; with nccl a gloo twin of every dp
    group is created (new_group must run on all ranks in the same order) and this rank's returned."""
    if device.type != "cuda":
        return mesh["dp"].get_group()
    mine, me = None, dist.get_rank()
    for p in range(pp):
        for t in range(tp):
            ranks = [((p * dp) + d) * tp + t for d in range(dp)]
            g = dist.new_group(ranks, backend="gloo")
            if me in ranks:
                mine = g
    return mine


class GradAllReduce:
    """Data parallelism after backward: mean of the (local shards of the) gradients over the dp group
    in one flat buffer, sent in bf16 when `mixed` (as bf16-mixed is priced).  Used for DTensor
    (tensor-parallel) modules, pipeline stages, and every CPU run: on a CPU the core that would run
    DDP's overlapped all-reduce is the one computing, so overlap buys nothing and the contention costs
    (gpt-small dp2 on 2 cores: 162 ms per step with DDP, 137 ms with this)."""

    def __init__(self, params, group, mixed: bool = False):
        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.mixed = mixed

    def __call__(self):
        n = dist.get_world_size(self.group)
        grads = []
        for p in self.params:
            if p.grad is not None and p.grad.is_sparse:      # host embedding rows: gloo sums sparse tensors
                g = p.grad.coalesce()
                dist.all_reduce(g, group=self.group)
                p.grad = g / n
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            # a vocabulary-split table's gradient comes back whole (Replicate): its rows only, as priced
            grads.append(local_grad(p))
        if not grads:
            return
        # one flat buffer kept across steps: a fresh multi-MB tensor each step costs page faults
        # (16 MB on this CPU: 10.5 ms to concatenate into a new buffer, ~3 ms into a reused one)
        total = sum(g.numel() for g in grads)
        buf = getattr(self, "_flat", None)
        if buf is None or buf.numel() != total or buf.dtype != grads[0].dtype or buf.device != grads[0].device:
            buf = self._flat = torch.empty(total, dtype=grads[0].dtype, device=grads[0].device)
        flat = torch.cat([g.reshape(-1) for g in grads], out=buf)
        if self.mixed and flat.dtype == torch.float32:
            wire = flat.to(torch.bfloat16)
            dist.all_reduce(wire, group=self.group)
            flat.copy_(wire)
        else:
            dist.all_reduce(flat, group=self.group)
        flat /= n
        _unflatten_into(flat, grads)


def _unflatten_into(flat, grads) -> None:
    """Copy a flat buffer back into the gradients it was concatenated from, in order."""
    off = 0
    for g in grads:
        g.copy_(flat[off:off + g.numel()].view_as(g))
        off += g.numel()


def wrap_dp(module: nn.Module, *, dp: int, tp: int, zero: int, mesh, blocks: list, device, notes: list,
            staged: bool = False, host_names: tuple = (), mixed: bool = False, grad_sync: str = "auto"):
    """Returns (module to run, gradient hook or None, effective zero level).  `host_names`: parameters
    kept out of DDP/FSDP/the all-reduce (host tables; the placement code averages their gradients)."""
    if dp == 1:
        return module, None, 0
    if not staged and batch_stats.sync_batch_norms(module, mesh["dp"].get_group()):
        notes.append("BatchNorm statistics are the global batch's: synced over the dp group (emit/dp/batch_stats.py)")
    if zero == 1 and tp > 1:
        notes.append("zero 1 with tensor parallelism runs as zero 2 (ZeroRedundancyOptimizer cannot hold DTensors)")
        zero = 2
    host = {id(p) for n, p in module.named_parameters() if n in set(host_names)}
    dense = [p for p in module.parameters() if id(p) not in host]
    if zero >= 2:
        fsdp(module, mesh["dp"], reshard=(zero == 3), blocks=blocks,
             ignored={p for p in module.parameters() if id(p) in host}, mixed=mixed)
        return module, None, zero
    post_backward = grad_sync == "allreduce" or (grad_sync == "auto" and device.type != "cuda")
    if tp > 1 or staged or post_backward:
        # DDP refuses DTensor parameters, and under a pipeline schedule (several backward passes per
        # step) its bucket rebuild asserts or, with static_graph, gives wrong gradients (torch 2.13);
        # on a CPU its overlap only contends for the cores (see GradAllReduce)
        return module, GradAllReduce(dense, mesh["dp"].get_group(), mixed=mixed), zero
    from torch.nn.parallel import DistributedDataParallel as DDP
    ids = [device.index] if device.type == "cuda" else None
    if host_names:      # host and device sparse tables: their own sync (emit.host / emit.sparse)
        DDP._set_params_and_buffers_to_ignore_for_model(module, list(host_names))
    sparse = any(isinstance(m, nn.Embedding) and m.sparse for m in module.modules())
    ddp = DDP(module, process_group=mesh["dp"].get_group(), device_ids=ids,
              find_unused_parameters=False, gradient_as_bucket_view=not sparse)
    if mixed:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
        ddp.register_comm_hook(mesh["dp"].get_group(), bf16_compress_hook)
    return ddp, None, zero


def make_optimizer(params, kind: str, lr: float, *, zero: int, dp_group=None):
    params = [p for p in params if p.requires_grad]
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}.get(kind)
    if cls is None:
        from ...errors import PlanError
        raise PlanError(f"optimizer {kind!r} is not supported; use adam, adamw or sgd")
    kw = {"lr": lr}
    if kind in ("adam", "adamw") and params and all(type(p) is nn.Parameter and p.device.type in ("cpu", "cuda")
                                                   for p in params):
        # the fused update reads p, g, m, v and writes p, m, v once (28 B per fp32 parameter, as the
        # cost model prices it); torch's default per-tensor loop on a CPU makes ~9 passes with
        # temporaries (4M-parameter MLP on this CPU: 18.8 ms per step -> see bench notes)
        kw["fused"] = True
    if zero == 1 and dp_group is not None:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(params, optimizer_class=cls, process_group=dp_group, **kw)
    return cls(params, **kw)
