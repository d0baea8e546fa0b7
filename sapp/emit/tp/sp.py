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
                     whose embedding's parent reads the whole output (an HF decoder's masks, positions);
                     in a traced pipeline stage too, the input found from the block's graph (`_InputFinder`)
    re-gather        the column-split linears of an entry save only this rank's shard of the gathered
                     input for backward and all-gather it again there (saved-tensor hooks), as Megatron
                     does and the cost model prices (34/t bytes per layer, Korthikanti 2022)
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ...errors import PlanError
from . import dtensor_local, sp_entry
from ..recompute.checkpointing import block_names


def section(plan) -> dict:
    """The plan's SP pieces ({} when sp is off).  A plan with sp on but pieces the emitter cannot place
    is refused here, before any rank communicates."""
    if not plan.parallel.get("sp") or plan.parallel["tp"] < 2:
        return {}
    sec = (plan._d.get("tp_layout") or {}).get("sp") or {}
    bad = sec.get("unsupported") or []
    if sec.get("block_scatter") and plan.parallel.get("pp", 1) > 1:
        # the cut runs on the stage holding the block; before it every boundary would send the whole
        # activation, while the plan prices the 1/t shard (the search keeps the block on stage 0)
        stages = plan.pipeline.get("stages") or []
        first = {b for s in stages if s.get("index") == 0 for b in s.get("blocks") or []}
        late = sorted(b for b in sec["block_scatter"] if stages and b not in first)
        if late:
            bad = [f"the residual stream is cut at {late[0]}'s entry, which is not on the first pipeline stage "
                   f"(the boundaries before it would send the whole activation, priced as the 1/t shard)"] + bad
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


def relayout_noted(sec: dict, module: nn.Module, notes: list) -> dict:
    """sp_entry.relayout with its note (once: a relayouted section moves nothing more)."""
    sec, moved = sp_entry.relayout(sec, module, {}, block_names(module))
    if moved and notes is not None:
        notes.append(f"sequence parallelism: the residual stream is cut at the blocks' input, not at {moved[0]}"
                     f"{f' (and {len(moved) - 1} more)' if len(moved) > 1 else ''} before them (code between "
                     f"reads the whole sequence: masks, positions)")
    return sec


def apply(module: nn.Module, sec: dict, tp_mesh, tp_plan: dict, notes: list, originals: dict = None) -> list:
    """The SP pieces present in `module` that the region styles (`tp_plan`: name -> style applied) do not
    already carry; then the re-gather hooks.  Returns the module names given an SP piece.  `originals`:
    the un-split model's modules by name (a traced stage holds stand-ins: is an entry a linear?)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleOutput, SequenceParallel, parallelize_module
    if not sec:
        return []
    mods = dict(module.named_modules())
    sp_entry.check_entries(sec, mods, block_names(module))
    sec = relayout_noted(sec, module, notes)

    def linear(n):
        return n_is_linear((originals or {}).get(n, mods[n]))
    extra = {}
    scatter, late = _late_cuts(sec, mods, tp_plan)
    for norm, axis in late.items():
        # registered before SequenceParallel's own input hook, so the norm's input arrives cut
        mods[norm].register_forward_pre_hook(_redistribute_input(axis, tp_mesh, False), with_kwargs=True)
    if late and notes is not None:
        notes.append(f"sequence parallelism: embeddings cut together where their sum enters {sorted(late)[0]} "
                     f"(a position embedding added to a cut word embedding would read the shard's length)")
    for name, axis in sec.get("norms", {}).items():
        if name in mods:
            # the DTensor output is made local by dtensor_local.local_outputs: a traced stage's norm may also hand
            # its input on (a tuple), which SequenceParallel's own to_local() cannot take
            extra[name] = SequenceParallel(sequence_dim=axis, use_local_output=False)
    gathers = [n for n in sec.get("entries", {}) if n in mods and n not in tp_plan]
    for name, axis in scatter.items():
        if name in mods and name not in tp_plan:
            extra[name] = PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Shard(axis),),
                                              use_local_output=True)
    if extra:
        parallelize_module(module, tp_mesh, extra)
    for name in sec.get("norms", {}):
        if name in extra:
            mods[name].register_forward_hook(dtensor_local.local_outputs)
            # read by the manifest: a norm without weights (OLMo's LayerNorm) has no replicated
            # DTensor to show that SequenceParallel wraps it
            mods[name].sapp_sp_norm = True
    # the modules that take the sequence-split activation in: which input of a traced module is it
    readers = set(extra) | {n for n, s in tp_plan.items() if s in ("colwise", "colwise_gather")}
    readers |= {n for n in sec.get("entries", {}) if n in mods and linear(n)}
    where = _InputFinder(mods, readers)
    for name in gathers:
        mods[name].register_forward_pre_hook(_redistribute_input(sec["entries"][name], tp_mesh, True, where(name)),
                                             with_kwargs=True)
    cuts = [n for n in sec.get("block_scatter", {}) if n in mods]
    for name in cuts:
        mods[name].register_forward_pre_hook(_redistribute_input(sec["block_scatter"][name], tp_mesh, False,
                                                                 where(name)), with_kwargs=True)
        mods[name].sapp_sp_scatter = True       # read by the manifest
    done = sorted(set(extra) | set(gathers) | set(cuts) | {n for n in tp_plan if any(n in sec.get(k, {}) for k in ("entries", "exits", "scatter"))})
    for name, axis in sec.get("entries", {}).items():
        if name in mods:
            openers = [n for n, s in tp_plan.items() if n.startswith(name + ".") and s == "colwise"]
            if linear(name):
                openers.append(name)        # a lone or replicated linear gathers its own input
            _regather(mods[name], axis, [mods[n] for n in openers if n in mods], tp_mesh, where(name))
    return done


def _late_cuts(sec: dict, mods: dict, tp_plan: dict) -> tuple:
    """(scatter cuts kept at an embedding's output, {norm: axis} cut at the norm's input instead).
    Embeddings whose parent also holds a sequence-parallel norm (BERT / DistilBERT: word + position
    embeddings, summed, then LayerNorm) are cut together where their sum enters that norm: cut at
    the word embedding, the parent reads the shard's length and looks up positions 0..s/t for every
    rank, which the position embedding's own cut then halves again (DistilBERT).  Same values as
    cutting each (a slice commutes with the sum); the sum runs on the whole sequence.  A
    vocabulary-split embedding keeps its reduce-scatter (no local slice to move), and its siblings
    their cuts."""
    scatter, late = dict(sec.get("scatter", {})), {}
    rank = sp_entry.module_order(mods[""]) if "" in mods else {}
    order = sorted(mods, key=lambda n: rank.get(n, len(rank)))      # call order where known
    sp_mods = set(sec.get("norms", {})) | set(sec.get("entries", {}))
    # a vocabulary-split embedding's reduce-scatter cannot move: its siblings keep their cuts too
    fixed = {n.rpartition(".")[0] for n in scatter if n in tp_plan}
    for name, axis in list(scatter.items()):
        if name not in mods or name in tp_plan or name.rpartition(".")[0] in fixed:
            continue
        # the next sequence-parallel module after the embedding: a norm beside it (not a final norm
        # past the blocks, as GPT-2's ln_f beside wte / wpe)
        i = order.index(name)
        norm = next((n for n in order[i + 1:] if n in sp_mods), None)
        if (norm in sec.get("norms", {}) and norm.rpartition(".")[0] == name.rpartition(".")[0]
                and sec["norms"][norm] == axis):
            del scatter[name]
            late[norm] = axis
    return scatter, late


class _InputFinder:
    """Which positional input of a module carries the activation its sequence readers (SP norms,
    column-split openers, lone linears: `readers`) take in.  A traced pipeline stage's modules
    (torch.export's InterpreterModules) take every tensor they use positionally, in the graph's
    order: an HF decoder layer is called (mask, cos, sin, hidden), its attention likewise, so "the
    first tensor" is the mask there.  The answer is read off the module's graph: the placeholder a
    reader (or a traced sub-module, at the position it takes its activation in) receives directly
    or through ops of that one value (a dropout, a cast).  None for eager modules (the first
    positional tensor, else `hidden_states`: HF's own call convention)."""

    def __init__(self, mods: dict, readers: set):
        self.mods, self.readers, self.memo = mods, readers, {}

    def __call__(self, name: str):
        """The index the hooks use: None for an eager module; a traced one without a single answer
        is refused before any rank communicates."""
        if not self._traced(name):
            return None
        i = self._index(name)
        if i is None:
            raise PlanError(f"sequence parallelism: cannot tell which input of the traced module {name} carries "
                            f"the activation; search again with sp pinned to false")
        return i

    def _traced(self, name: str) -> bool:
        from torch import fx
        return isinstance(getattr(self.mods.get(name), "graph", None), fx.Graph)

    def _index(self, name: str):
        if name not in self.memo:
            places = [n for n in self.mods[name].graph.nodes if n.op == "placeholder"]
            if name in self.readers and len(places) == 1:      # a traced linear / norm: its one input
                self.memo[name] = 0
            else:
                hits = [i for i, p in enumerate(places) if self._reaches(name, p)]
                self.memo[name] = hits[0] if len(hits) == 1 else None
        return self.memo[name]

    def _reaches(self, name, node) -> bool:
        todo, seen = [node], set()
        while todo:
            v = todo.pop()
            for u in v.users:
                if u in seen:
                    continue
                seen.add(u)
                if u.op == "call_module":
                    full = f"{name}.{u.target}"
                    if full in self.readers and u.args and u.args[0] is v:
                        return True
                    if self._traced(full) and v in u.args and self._index(full) == u.args.index(v):
                        return True
                elif u.op == "call_function":
                    if u.all_input_nodes == [v]:          # an op of this value alone (dropout, cast): follow it
                        todo.append(u)
        return False


def _redistribute_input(axis: int, tp_mesh, gather: bool, index=None):
    """A forward pre-hook moving a module's activation input between this rank's sequence shard and
    the whole tensor, autograd-aware (DTensor redistribute; backward does the reverse collective):
    gather = True all-gathers (Shard -> Replicate: PrepareModuleInput's job, for modules called with
    keyword arguments too, as HF layers pass hidden_states=...); False cuts the shard (Replicate ->
    Shard, a local slice: where an HF decoder's residual stream enters its first layer, plan
    `block_scatter`).  The input is positional argument `index` (a traced module, _InputFinder), else
    the first positional tensor, else `hidden_states` or the first tensor keyword with the axis."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    src, dst = ((Shard(axis),), (Replicate(),)) if gather else ((Replicate(),), (Shard(axis),))

    def move(x):
        return DTensor.from_local(x, tp_mesh, src, run_check=False).redistribute(tp_mesh, dst).to_local()

    def hook(mod, args, kwargs):
        i = _pick(args, kwargs, axis, index)
        if i is None:
            raise PlanError(f"sequence parallelism: {type(mod).__name__} got no tensor input to "
                            f"{'gather' if gather else 'cut'}; search again with sp pinned to false")
        x = args[i] if isinstance(i, int) else kwargs[i]
        if not gather:
            if isinstance(i, int):
                return args[:i] + (move(x),) + tuple(args[i + 1:]), kwargs
            return args, dict(kwargs, **{i: move(x)})
        # an entry gathers every argument that is a shard of the stream, not only the first: torchtune's
        # attn(h, h) takes keys and values from its second (gathering one left them half the sequence:
        # 3.5e-4 off at step 0); the same tensor is gathered once, so `y is x` holds in the module
        done = {}

        def one(k, v):
            if not (k == i or (torch.is_tensor(v) and _carries_sequence(x, v, axis))):
                return v
            if id(v) not in done:
                done[id(v)] = move(v)
            return done[id(v)]
        return (tuple(one(k, v) for k, v in enumerate(args)),
                {k: one(k, v) for k, v in kwargs.items()})
    return hook


def _carries_sequence(x, v, axis: int) -> bool:
    """Whether `v`, beside the activation `x` a module takes in (this rank's sequence shard), is a shard
    of a sequence-split stream too: the same rank and the same extent up to and along the sequence
    axis (batch, shard length), of a floating dtype.  A mask (another rank), positions or a tensor over
    the whole sequence (another length) are left alone; width may differ (keys from another stream)."""
    return (v is x or (v.is_floating_point() and v.dim() == x.dim() and v.dim() > axis
                       and tuple(v.shape[:axis + 1]) == tuple(x.shape[:axis + 1])))


def _pick(args, kwargs, axis, index=None):
    """Where a module's activation input is: a positional index or a keyword (see _redistribute_input)."""
    if index is not None:
        return index if index < len(args) and torch.is_tensor(args[index]) else None
    if args and torch.is_tensor(args[0]):
        return 0
    if torch.is_tensor(kwargs.get("hidden_states")):
        return "hidden_states"
    return next((k for k, v in kwargs.items() if torch.is_tensor(v) and v.dim() > axis), None)


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


def _regather(entry: nn.Module, axis: int, openers: list, tp_mesh, index=None) -> None:
    """Saved-tensor hooks around the entry's column-split linears: a saved tensor living in the gathered
    input's storage is kept as this rank's sequence shard and all-gathered again when backward needs it."""
    from ..runtime import memory_meter
    group = tp_mesh.get_group()
    n, me = dist.get_world_size(group), dist.get_rank(group)
    g = _Gathered()

    def seen(mod, args, kwargs):
        i = _pick(args, kwargs, axis, index)
        x = None if i is None else args[i] if isinstance(i, int) else kwargs[i]
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
    norms whose own weights are replicated DTensors on "tp" (only SequenceParallel makes them so; a
    norm with no weights, by the mark apply leaves beside its hooks) and entries carrying re-gather hooks.  {} when none."""
    norms, entries, cuts = set(), set(), set()
    for mod in mods.values():
        for name, m in mod.named_modules():
            own = list(m.parameters(recurse=False))
            if own and not isinstance(m, (nn.Linear, nn.Embedding)) and all(_replicated_on_tp(p) for p in own):
                norms.add(name)
            elif not own and getattr(m, "sapp_sp_norm", False):
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
    if len(mods) == 1:                          # one module: the pieces sp.apply moved (sp_entry)
        mod = next(iter(mods.values()))
        sec = sp_entry.relayout(sec, mod, {}, block_names(mod))[0]
    pick = lambda key: {n for n in (sec or {}).get(key, {}) if n in names}   # noqa: E731
    return _pieces(pick("norms"), pick("entries"), pick("block_scatter"))


def _replicated_on_tp(p) -> bool:
    from torch.distributed.tensor import DTensor, Replicate
    if not isinstance(p, DTensor):
        return False
    names = p.device_mesh.mesh_dim_names or ()
    return "tp" in names and isinstance(p.placements[names.index("tp")], Replicate)
