"""Device mesh, tensor parallelism and data parallelism / ZeRO for one module (a whole model or one
pipeline stage).

Mapping (plan feature -> torch runtime):
  mesh            init_device_mesh(type, (pp, dp, tp), ("pp", "dp", "tp")); rank = ((pp_i*dp)+dp_i)*tp+tp_i
  tp_modules      DTensor parallelize_module with ColwiseParallel / RowwiseParallel on mesh["tp"]
  zero 0, tp=1    DistributedDataParallel over the dp group (CUDA)
  zero 0, tp>1    gradient all-reduce (mean) of the local shards over the dp group after backward
  or pipeline     (DDP refuses DTensor parameters; DDP under a multi-micro-batch pipeline schedule
  or CPU          fails its bucket rebuild in torch 2.13; on CPU overlap only contends for the cores)
  bf16-mixed      autocast(bf16) around forward + loss; DDP bf16_compress_hook / bf16 flat all-reduce;
                  FSDP2 MixedPrecisionPolicy(param_dtype=reduce_dtype=bf16).  Pipeline stages: fp32
  zero 1          DDP (or the all-reduce above) + ZeroRedundancyOptimizer over the dp group; with tp>1
                  ZeroRedundancyOptimizer cannot hold DTensors, so it runs as zero 2
  zero 2          FSDP2 fully_shard(reshard_after_forward=False) per block + root over mesh["dp"]
  zero 3          FSDP2 fully_shard per block + root over mesh["dp"]
  host tables     kept out of DDP / FSDP2 / the all-reduce; sapp/emit/host/host.py averages their sparse
                  gradients over a gloo dp group
Pipeline stages are traced (torch.export) and hold InterpreterModules instead of nn.Linear: tensor
parallelism puts a copy of the original layer back before sharding it (PP x TP)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from . import batch_stats, conv1d, dtensor_local, sp
from ..recompute.checkpointing import block_names


def build_mesh(device: torch.device, pp: int, dp: int, tp: int):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))


def coords(rank: int, pp: int, dp: int, tp: int) -> tuple:
    """(pp_i, dp_i, tp_i) of a rank: rank = ((pp_i * dp) + dp_i) * tp + tp_i."""
    return rank // (dp * tp), (rank // tp) % dp, rank % tp


def _partnered(name: str, styles: dict, other: str) -> bool:
    """A colwise layer feeds a rowwise one in the same parent (qkv->proj, fc1->fc2): its output can
    stay sharded.  Otherwise (an output head) it must come back Replicate."""
    parent = name.rpartition(".")[0]
    return any(n.rpartition(".")[0] == parent and s == other for n, s in styles.items() if n != name)


def _restore_leaf(module: nn.Module, name: str, original: nn.Module) -> nn.Module:
    """A pipeline stage (torch.export + unflatten) holds an InterpreterModule where the model had an
    nn.Linear/Embedding; DTensor only shards the real class, so put a copy of the original layer back
    with the stage's current weights (same call signature: one tensor in, one out)."""
    import copy
    leaf = copy.deepcopy(original)
    state = module.get_submodule(name).state_dict()
    if all(state[k].shape == v.shape for k, v in leaf.state_dict().items() if k in state):
        leaf.load_state_dict(state)
    # else the stage was traced with a local-shape stand-in (see local_layers): the original's
    # values are the stage's, as nothing has trained yet
    parent, _, child = name.rpartition(".")
    setattr(module.get_submodule(parent) if parent else module, child, leaf)
    return leaf


def _leaf_type(m) -> bool:
    return isinstance(m, (nn.Linear, nn.Embedding)) or conv1d.is_conv1d(m)


def _tp_leaf(module, mods, name, originals):
    """The Linear/Embedding/Conv1D at `name` in `module` (a pipeline stage's traced stand-in replaced
    by a copy of the original layer), or None when it is another layer type."""
    orig = (originals or {}).get(name)
    if not _leaf_type(mods[name]) and _leaf_type(orig):
        mods[name] = _restore_leaf(module, name, orig)
    return mods[name] if _splittable(mods[name]) else None


def _splittable(m) -> bool:
    """A Linear / Embedding DTensor's styles can split: one holding sub-modules with parameters of
    their own (an HF embedding subclass with a scale or a projection inside) makes DTensor register
    dotted parameter names (KeyError "parameter name can't contain '.'").  HF's Conv1D too, with
    styles of its own (sapp/emit/tp/conv1d.py)."""
    return conv1d.is_conv1d(m) or (isinstance(m, (nn.Linear, nn.Embedding)) and not any(
        True for c in m.children() for _ in c.parameters()))


def _derived_styles(module, mods, styles, groups, originals, notes, dry: bool = False, sp_sec=None):
    """Styles of a plan whose layout came from the graph (sapp/search/tp_layout.py): a group (one
    region: column-split openers, row-split closers) is sharded whole or, when one of its layers is
    not a Linear/Embedding DTensor can split, not at all (a half-sharded region computes wrong
    values)."""
    from torch.distributed.tensor import Replicate
    # torch's Colwise/RowwiseParallel, subclassed to also split HF's Conv1D on its [in, out] layout
    ColwiseParallel, RowwiseParallel = conv1d.styles()      # noqa: N806 - torch's class names
    plan = {}
    owners = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), set()).add(n.rpartition(".")[0])
    for group in groups:
        here = [n for n in group if n in mods and n in styles]
        if not here:
            continue
        leaves = {n: (mods[n] if _splittable(mods[n]) else None) if dry
                  else _tp_leaf(module, mods, n, originals) for n in here}
        odd = [n for n, leaf in leaves.items() if leaf is None]
        tied = [n for n, leaf in leaves.items() if leaf is not None and len(owners.get(id(leaf.weight), ())) > 1]
        if tied:
            if notes is not None:
                notes.append(f"tp region {here[0]} .. runs replicated: {tied[0]}'s weight is tied to another module")
            continue
        if odd:
            if notes is not None:
                notes.append(f"tp region {here[0]} .. runs replicated: {odd[0]} is a {type(mods[odd[0]]).__name__}, "
                             f"and DTensor splits only Linear and Embedding (without sub-modules' parameters)")
            continue
        for n in here:
            style = styles[n]
            # sequence parallelism (sapp/emit/tp/sp.py) moves an entry's gather / an exit's reduction here
            kw = sp.adjust(n, style, sp_sec or {}, {})
            if dry:
                plan[n] = style
            elif style == "colwise":              # output stays split for the ops up to the closer
                plan[n] = ColwiseParallel(**kw)
            elif style == "colwise_gather":     # a lone column split (LM head): output gathered
                plan[n] = ColwiseParallel(**dict({"output_layouts": Replicate()}, **kw))
            elif style == "rowwise":            # input arrives split from the region's openers
                plan[n] = RowwiseParallel(**kw)
            else:                               # vocab: embedding rows split, partial sums reduced
                plan[n] = RowwiseParallel(**dict({"input_layouts": Replicate()}, **kw))
    return plan


def local_layers(model: nn.Module, styles: dict, tp: int, groups) -> dict:
    """Stand-ins with this rank's shapes for the layers a derived layout splits with a sharded side
    ({name: module}), for tracing a pipeline: torch.export bakes shapes read in forward into the
    graph (HF's repeat_kv expands to the global head count), so a stage traced on full-width layers
    cannot run on split ones.  Traced on these, every later op sees local head counts; emit then
    puts the real layer back and shards it (apply_tp).  Hand-written plans (no groups): none."""
    if not groups or tp <= 1:
        return {}
    mods = dict(model.named_modules())
    plan = _derived_styles(model, dict(mods), styles, groups, None, None, dry=True)
    out = {}
    for name, style in plan.items():
        lin = mods[name]
        if conv1d.is_conv1d(lin):           # weight [in, out]: nx in, nf out features
            if style in ("colwise", "rowwise"):
                k, n = (lin.nx, lin.nf // tp) if style == "colwise" else (lin.nx // tp, lin.nf)
                out[name] = conv1d.resized(lin, k, n)
        elif style == "colwise":
            out[name] = _resized(lin, lin.in_features, lin.out_features // tp)
        elif style == "rowwise":
            out[name] = _resized(lin, lin.in_features // tp, lin.out_features)
    return out


def _resized(lin: nn.Linear, k: int, n: int) -> nn.Linear:
    """A copy of `lin` with an (n, k) weight (and n bias), of its own class: a subclass's forward
    (Falcon's `x @ self.weight.T`) runs the same ops as the layer it stands in for, so the shape
    audit's second capture lines up with the first op for op."""
    import copy
    new = copy.copy(lin)                       # the attributes, without copying the weights
    new._parameters = dict(lin._parameters)
    new._buffers, new._modules = dict(lin._buffers), dict(lin._modules)
    w = lin.weight
    new.weight = nn.Parameter(torch.zeros((n, k), dtype=w.dtype, device=w.device), requires_grad=w.requires_grad)
    if lin.bias is not None:
        new.bias = nn.Parameter(torch.zeros(n, dtype=w.dtype, device=w.device))
    new.in_features, new.out_features = k, n
    return new


def apply_tp(module: nn.Module, styles: dict, tp_mesh, notes: list = None, originals: dict = None,
             groups: list = None, sp_sec: dict = None) -> list:
    """Shard the named Linear/Embedding layers present in `module`; returns the names sharded.
    `groups` (plans from sapp's search): the layout's regions, each sharded whole or not at all, with
    the styles meaning exactly what tp_layout derived.  Without groups (hand-written plans) a colwise
    layer keeps its output split when a rowwise sibling follows it (same parent), and other layer
    types stay replicated, with a note: still correct, only slower.  HF's Conv1D (GPT-2) is split
    like a Linear on its own [in, out] layout (sapp/emit/tp/conv1d.py).
    `originals`: the un-split model's modules by name (pipeline stages hold traced stand-ins)."""
    from torch.distributed.tensor import Replicate
    ColwiseParallel, RowwiseParallel = conv1d.styles()      # noqa: N806 - torch's, also for Conv1D
    mods = dict(module.named_modules())
    if groups is not None:
        if sp_sec:      # cuts before the blocks moved to the blocks' input (sapp/emit/tp/sp_entry.py)
            sp_sec = sp.relayout_noted(sp_sec, module, notes)
        plan = _derived_styles(module, mods, styles, groups, originals, notes, sp_sec=sp_sec)
        if plan:
            _parallelize(module, tp_mesh, plan)
        if sp_sec:      # sequence parallelism between the regions (plan tp_layout.sp)
            sp.apply(module, sp_sec, tp_mesh, {n: styles[n] for n in plan}, notes, originals)
        return sorted(plan)
    present = {}
    for n, s in sorted(styles.items()):
        if n not in mods:
            continue
        if _tp_leaf(module, mods, n, originals) is None:
            if notes is not None:
                notes.append(f"tp_modules[{n}] is a {type(mods[n]).__name__}; DTensor splits only Linear, "
                             f"Embedding and HF's Conv1D, so it runs replicated")
            continue
        present[n] = "rowwise" if s == "vocab" else ("colwise" if s == "colwise_gather" else s)
    plan = {}
    for name, style in present.items():
        if style == "colwise":
            keep = _partnered(name, present, "rowwise") and styles[name] != "colwise_gather"
            plan[name] = ColwiseParallel() if keep else ColwiseParallel(output_layouts=Replicate())
        else:
            fed = _partnered(name, present, "colwise")
            if isinstance(mods[name], nn.Embedding):
                plan[name] = RowwiseParallel(input_layouts=Replicate())
            else:
                plan[name] = RowwiseParallel() if fed else RowwiseParallel(input_layouts=Replicate())
    if plan:
        _parallelize(module, tp_mesh, plan)
    return sorted(plan)


def _parallelize(module, tp_mesh, plan: dict) -> None:
    """parallelize_module, the layers' outputs handed on as local tensors the model may modify in
    place (sapp/emit/tp/dtensor_local.py)."""
    from torch.distributed.tensor.parallel import parallelize_module
    dtensor_local.hand_back_local(module, plan)
    parallelize_module(module, tp_mesh, plan)
    dtensor_local.register(module, plan)


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
    for name in blocks:
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
            g = p.grad
            grads.append(g.to_local() if hasattr(g, "to_local") else g)
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


class TPPartialGrads:
    """After backward: the gradients of replicated parameters that a sharded region applies to this
    rank's part only (shape_audit.partial_params: a q_norm over head_dim on this rank's heads) are
    summed over the tp group, so every tp rank steps the same full gradient, as one process does.
    One flat all-reduce; under FSDP a gradient is this rank's dp shard, the same layout on every tp
    rank, so its local part is summed."""

    def __init__(self, params, group):
        self.params = [p for p in params if p.requires_grad]
        self.group = group

    def __call__(self):
        grads = [(p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad)
                 for p in self.params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        _unflatten_into(flat, grads)


def wrap_dp(module: nn.Module, *, dp: int, tp: int, zero: int, mesh, blocks: list, device, notes: list,
            staged: bool = False, host_names: tuple = (), mixed: bool = False, grad_sync: str = "auto"):
    """Returns (module to run, gradient hook or None, effective zero level).  `host_names`: parameters
    kept out of DDP/FSDP/the all-reduce (host tables; the placement code averages their gradients)."""
    if dp == 1:
        return module, None, 0
    if not staged and batch_stats.sync_batch_norms(module, mesh["dp"].get_group()):
        notes.append("BatchNorm statistics are the global batch's: synced over the dp group (emit/batch_stats.py)")
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


__all__ = ["build_mesh", "coords", "apply_tp", "wrap_dp", "make_optimizer", "block_names", "GradAllReduce"]
