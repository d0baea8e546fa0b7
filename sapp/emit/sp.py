"""Megatron sequence parallelism (SP) at run time, as the plan's `tp_layout.sp` section places it
(derived from the graph by sapp/search/sp_layout.py, priced by sapp/pipeline/sp_profile.py).

    plan piece       torch runtime (DTensor, mesh["tp"])
    norms            SequenceParallel(sequence_dim, use_local_output=True): replicated weights, input and
                     output this rank's sequence shard (dropouts and residual adds need nothing: they
                     run on the local shards as plain tensors)
    entries          a region's module (attention, MLP) all-gathers its input (Shard(seq) -> Replicate,
                     PrepareModuleInput's job, here also for keyword inputs: `_redistribute_input`) before any
                     op reads the input's shape; a lone linear (the LM head)
                     takes ColwiseParallel(input_layouts=Shard(seq)) instead
    exits            RowwiseParallel(output_layouts=Shard(seq)): reduce-scatter instead of all-reduce
    scatter          an embedding's output cut to this rank's shard: RowwiseParallel(output_layouts=
                     Shard(seq)) when vocabulary-split (reduce-scatter), else PrepareModuleOutput
                     (Replicate -> Shard(seq): a local slice)
    block_scatter    the same cut where the first block takes its input in (`_redistribute_input`), for models
                     whose embedding's parent reads the whole output (an HF decoder's masks, positions)
    re-gather        the column-split linears of an entry save only this rank's shard of the gathered
                     input for backward and all-gather it again there (saved-tensor hooks), as Megatron
                     does and the cost model prices (34/t bytes per layer, Korthikanti 2022)
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..errors import PlanError


def section(plan) -> dict:
    """The plan's SP pieces ({} when sp is off).  A plan with sp on but pieces the emitter cannot place
    is refused here, before any rank communicates."""
    if not plan.parallel.get("sp") or plan.parallel["tp"] < 2:
        return {}
    sec = (plan._d.get("tp_layout") or {}).get("sp") or {}
    bad = sec.get("unsupported") or []
    if sec.get("block_scatter") and plan.parallel.get("pp", 1) > 1:
        bad = [f"the residual stream is cut at {sorted(sec['block_scatter'])[0]}'s entry, which the traced pipeline "
               f"stages do not run yet (sequence parallelism of this model is emitted at pp=1)"] + bad
    if bad:
        raise PlanError(f"sequence parallelism cannot be emitted here ({bad[0]}); search again with sp pinned "
                        f"to false (constraints sp=false)")
    return sec


def adjust(name: str, style: str, sec: dict, kw: dict) -> dict:
    """Layout keywords a region layer's DTensor style takes under SP (parallel._derived_styles)."""
    from torch.distributed.tensor import Shard
    if not sec:
        return kw
    if style in ("colwise", "colwise_gather") and name in sec.get("entries", {}):
        kw["input_layouts"] = Shard(sec["entries"][name])
    elif style == "rowwise" and name in sec.get("exits", {}):
        kw["output_layouts"] = Shard(sec["exits"][name])
    elif style == "vocab" and name in sec.get("scatter", {}):
        kw["output_layouts"] = Shard(sec["scatter"][name])
    return kw


def apply(module: nn.Module, sec: dict, tp_mesh, tp_plan: dict, notes: list) -> list:
    """The SP pieces present in `module` that the region styles (`tp_plan`: name -> style applied) do not
    already carry; then the re-gather hooks.  Returns the module names given an SP piece."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleOutput, SequenceParallel, parallelize_module
    if not sec:
        return []
    mods = dict(module.named_modules())
    extra = {}
    for name, axis in sec.get("norms", {}).items():
        if name in mods:
            extra[name] = SequenceParallel(sequence_dim=axis, use_local_output=True)
    gathers = [n for n in sec.get("entries", {}) if n in mods and n not in tp_plan]
    for name, axis in sec.get("scatter", {}).items():
        if name in mods and name not in tp_plan:
            extra[name] = PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Shard(axis),),
                                              use_local_output=True)
    if extra:
        parallelize_module(module, tp_mesh, extra)
    for name in gathers:
        mods[name].register_forward_pre_hook(_redistribute_input(sec["entries"][name], tp_mesh, gather=True), with_kwargs=True)
    cuts = [n for n in sec.get("block_scatter", {}) if n in mods]
    for name in cuts:
        mods[name].register_forward_pre_hook(_redistribute_input(sec["block_scatter"][name], tp_mesh, gather=False), with_kwargs=True)
        mods[name].sapp_sp_scatter = True       # read by the manifest
    done = sorted(set(extra) | set(gathers) | set(cuts) | {n for n in tp_plan if any(n in sec.get(k, {}) for k in ("entries", "exits", "scatter"))})
    for name, axis in sec.get("entries", {}).items():
        if name in mods:
            openers = [n for n, s in tp_plan.items() if n.startswith(name + ".") and s == "colwise"]
            if n_is_linear(mods[name]):
                openers.append(name)        # a lone or replicated linear gathers its own input
            _regather(mods[name], axis, [mods[n] for n in openers if n in mods], tp_mesh)
    return done


def _redistribute_input(axis: int, tp_mesh, gather: bool):
    """A forward pre-hook moving a module's activation input between this rank's sequence shard and
    the whole tensor, autograd-aware (DTensor redistribute; backward does the reverse collective):
    gather = True all-gathers (Shard -> Replicate: PrepareModuleInput's job, for modules called with
    keyword arguments too, as HF layers pass hidden_states=...); False cuts the shard (Replicate ->
    Shard, a local slice: where an HF decoder's residual stream enters its first layer, plan
    `block_scatter`).  The input is the first positional tensor, else `hidden_states` or the first
    tensor keyword with the axis."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    src, dst = ((Shard(axis),), (Replicate(),)) if gather else ((Replicate(),), (Shard(axis),))

    def move(x):
        return DTensor.from_local(x, tp_mesh, src, run_check=False).redistribute(tp_mesh, dst).to_local()

    def hook(mod, args, kwargs):
        if args and torch.is_tensor(args[0]):
            return (move(args[0]),) + tuple(args[1:]), kwargs
        key = "hidden_states" if torch.is_tensor(kwargs.get("hidden_states")) else next(
            (k for k, v in kwargs.items() if torch.is_tensor(v) and v.dim() > axis), None)
        if key is None:
            raise PlanError(f"sequence parallelism: {type(mod).__name__} got no tensor input to "
                            f"{'gather' if gather else 'cut'}; search again with sp pinned to false")
        return args, dict(kwargs, **{key: move(kwargs[key])})
    return hook


def n_is_linear(m) -> bool:
    return isinstance(m, nn.Linear)


def _local(t):
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _ptr(t):
    try:
        return _local(t).untyped_storage().data_ptr()
    except Exception:
        return None


class _Gathered:
    """The input an entry module all-gathered in this forward (its storage, shape, sequence axis) and
    the shard kept of it: one for all the entry's openers (HF's q/k/v, gate/up read the same input,
    which the cost model prices saved once)."""
    ptr = None
    shape = None
    offset = 0
    held = None


def _regather(entry: nn.Module, axis: int, openers: list, tp_mesh) -> None:
    """Saved-tensor hooks around the entry's column-split linears: a saved tensor living in the gathered
    input's storage is kept as this rank's sequence shard and all-gathered again when backward needs it."""
    from . import memory_meter
    group = tp_mesh.get_group()
    n, me = dist.get_world_size(group), dist.get_rank(group)
    g = _Gathered()

    def seen(mod, args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states", next(
            (v for v in kwargs.values() if torch.is_tensor(v) and v.dim() > axis), None))
        loc = _local(x) if torch.is_tensor(x) else None
        g.held = None
        if loc is not None and loc.is_contiguous() and loc.dim() > axis and loc.shape[axis] % n == 0:
            g.ptr, g.shape, g.offset = _ptr(x), tuple(loc.shape), loc.storage_offset()
        else:
            g.ptr = None

    def pack(t):
        meter = memory_meter.ACTIVE
        if g.ptr is None or not torch.is_tensor(t) or _ptr(t) != g.ptr:
            return ("plain", meter._pack(t) if meter is not None else t)
        loc = _local(t)
        if g.held is None:
            base = loc.as_strided(g.shape, _contiguous_stride(g.shape), g.offset)
            k = g.shape[axis] // n
            shard = base.narrow(axis, me * k, k).clone()
            g.held = meter._pack(shard) if meter is not None else shard
        dt = None
        if hasattr(t, "_local_tensor"):
            dt = (t.device_mesh, t.placements, t.shape, t.stride())
        return ("shard", g.held, (loc.size(), loc.stride(), loc.storage_offset() - g.offset), dt)

    def _open(h):
        # the meter samples at every unpack (FSDP2 gathers are live then); no meter: unwrap its handle
        meter = memory_meter.ACTIVE
        if meter is not None:
            return meter._unpack(h)
        return h.t if isinstance(h, memory_meter._Held) else h

    def unpack(p):
        if p[0] == "plain":
            return _open(p[1])
        _, held, (size, stride, off), dt = p
        shard = _open(held)
        parts = [torch.empty_like(shard) for _ in range(n)]
        dist.all_gather(parts, shard.contiguous(), group=group)
        full = torch.cat(parts, dim=axis)
        loc = full.as_strided(size, stride, off)
        if dt is None:
            return loc
        from torch.distributed.tensor import DTensor
        with torch.no_grad():
            return DTensor.from_local(loc, dt[0], dt[1], run_check=False, shape=dt[2], stride=dt[3])

    ctx = []

    def enter(mod, args):
        if g.ptr is not None and torch.is_grad_enabled():
            h = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
            h.__enter__()
            ctx.append(h)

    def leave(mod, args, out):
        if ctx:
            ctx.pop().__exit__(None, None, None)

    def done(mod, args, out):
        g.held = None           # the openers' saved copies hold the shard now; keep no reference past them

    entry.register_forward_pre_hook(seen, with_kwargs=True)
    entry.register_forward_hook(done)
    for m in openers:
        m.register_forward_pre_hook(enter)
        m.register_forward_hook(leave)
    entry.sapp_sp_regather = True         # read by the manifest


def _contiguous_stride(shape):
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    return tuple(reversed(st))


def observed(mods: dict) -> dict:
    """What sequence parallelism runs in a rank's stage modules ({stage: module}), read off the objects:
    norms whose own weights are replicated DTensors on "tp" (only SequenceParallel makes them so) and
    entries carrying re-gather hooks.  {} when none."""
    norms, entries, cuts = set(), set(), set()
    for mod in mods.values():
        for name, m in mod.named_modules():
            own = list(m.parameters(recurse=False))
            if own and not isinstance(m, (nn.Linear, nn.Embedding)) and all(_replicated_on_tp(p) for p in own):
                norms.add(name)
            if getattr(m, "sapp_sp_regather", False):
                entries.add(name)
            if getattr(m, "sapp_sp_scatter", False):
                cuts.add(name)
    return _pieces(norms, entries, cuts)


def _pieces(norms, entries, cuts) -> dict:
    if not (norms or entries or cuts):
        return {}
    out = {"norms": sorted(norms), "entries": sorted(entries)}
    if cuts:
        out["block_scatter"] = sorted(cuts)
    return out


def expected(sec: dict, mods: dict) -> dict:
    """The plan's SP pieces present in this rank's stage modules (the manifest's vocabulary)."""
    names = {n for mod in mods.values() for n, _ in mod.named_modules()}
    pick = lambda key: {n for n in (sec or {}).get(key, {}) if n in names}   # noqa: E731
    return _pieces(pick("norms"), pick("entries"), pick("block_scatter"))


def _replicated_on_tp(p) -> bool:
    from torch.distributed.tensor import DTensor, Replicate
    if not isinstance(p, DTensor):
        return False
    names = p.device_mesh.mesh_dim_names or ()
    return "tp" in names and isinstance(p.placements[names.index("tp")], Replicate)
