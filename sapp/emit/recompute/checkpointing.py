"""Activation recomputation: the plan's recompute section -> torch.utils.checkpoint, recomputing exactly
what the cost model priced.

"full" checkpoints a whole block (only its input is kept, the whole forward runs again).  "selective"
is priced (sapp/pipeline/profile.py, `attention_core`) as dropping what the attention core saves: the
operators from the q.k^T matmul (inclusive) to the .v matmul (exclusive) -- scale, mask, softmax,
dropout -- are recomputed, nothing else.  It is emitted as selective activation checkpointing
(`create_selective_checkpoint_contexts`) on the smallest module holding that core (found by capture,
not by a child's name), with a policy that marks the core's operators PREFER_RECOMPUTE and every other
operator MUST_SAVE, so no GEMM outside the core (QKV, output projection) runs twice.  A selective
block without an attention core is a PlanError: recomputing nothing while the plan counts the saving
would be a silent lie.  Which operators did recompute is recorded per block for the manifest.

The module's forward is replaced on the instance, so names, hooks and wrappers that come later (tensor
parallel, DDP, FSDP2) see the same module tree."""
from __future__ import annotations

import functools
import weakref

import torch
from torch import nn
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ...errors import PlanError

aten = torch.ops.aten
# matmuls whose operands may both be activations (q.k^T, att.v); a linear layer runs addmm / mm on a
# weight, which is not an activation and so never opens or closes the core
_ACT_MATMULS = {aten.bmm.default, aten.mm.default, aten.baddbmm.default, aten.matmul.default}
_GEMMS = _ACT_MATMULS | {aten.addmm.default, aten.addbmm.default, aten.linear.default}
_SOFTMAX = {aten._softmax.default, aten.softmax.int, aten._safe_softmax.default}


def block_names(model: nn.Module) -> list:
    """Repeated blocks: the children of every ModuleList (`layers.3`, `transformer.h.0`)."""
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList):
            out += [f"{name}.{child}" if name else child for child, _ in mod.named_children()]
    return out


def plan_modes(section: dict, model: nn.Module) -> dict:
    """{block name: mode} for this model: explicit block entries win over the default."""
    default = section.get("default", "none") or "none"
    modes = {}
    if default != "none":
        modes = {b: default for b in block_names(model)}
    modes.update(section.get("blocks") or {})
    return {k: v for k, v in sorted(modes.items()) if v != "none"}


# ---- what the plan priced ------------------------------------------------------------------------
def op_signature(names) -> dict:
    """What a recomputed set is compared on: its matmuls and softmaxes (the s^2 work a core holds).
    Elementwise ops and views are left out: a dropout of p = 0 runs no op at all, and how torch
    decomposes a mask or a scale is not the plan's business."""
    sig = {}
    for n in names:
        k = "matmul" if n in ("matmul", "bmm", "mm", "baddbmm", "addmm", "linear") else (
            "softmax" if n in ("softmax", "_softmax", "_safe_softmax") else None)
        if k:
            sig[k] = sig.get(k, 0) + 1
    return dict(sorted(sig.items()))


def _common_module(mods) -> str:
    parts = [m.split(".") for m in mods if m]
    if not parts:
        return ""
    out = []
    for xs in zip(*parts):
        if len(set(xs)) != 1:
            break
        out.append(xs[0])
    return ".".join(out)


def priced_regions(model: nn.Module, modes: dict, example_inputs) -> dict:
    """{selective block: {"region": module to checkpoint, "priced": op_signature of the core}} from
    the model's capture, the graph the plan was priced on.  A block whose capture has no attention
    core was priced as "none" and maps to region None (nothing to recompute); a block capture does
    not know maps to None (refused by apply).  Capturing costs a fraction of a second for the zoo's small models, and only runs when a
    plan asks for selective recomputation."""
    sel = sorted(b for b, m in modes.items() if m == "selective")
    if not sel:
        return {}
    from ...capture import capture
    from ...pipeline.profile import attention_core
    graph, err = None, None
    # the zoo's own inputs first (what search captured); a model the zoo does not know needs the caller's
    for how in ("zoo", "given"):
        try:
            if how == "zoo" and getattr(model, "sapp_spec", None) is not None:
                graph = capture(model, batch=8)
            elif how == "given" and example_inputs is not None:
                graph = capture(model, tuple(example_inputs))
        except Exception as e:
            err = e
        if graph is not None:
            break
    if graph is None:
        raise PlanError(f"selective recomputation needs the model's capture to find the priced attention core, "
                        f"and capture failed ({type(err).__name__}); use recompute 'full' or 'none'") from None
    out = {}
    for b in sel:
        names = graph.blocks.get(b) or [n for n, nd in graph.nodes.items()
                                        if nd.module == b or (nd.module or "").startswith(b + ".")]
        if not names:
            out[b] = None           # the plan's block is nowhere in the captured graph
            continue
        core = attention_core(graph, names)
        if not core:
            # priced like "none" (nothing dropped, nothing recomputed): run it that way
            out[b] = {"region": None, "priced": {}}
            continue
        region = _common_module(graph.nodes[n].module for n in core)
        if not (region == b or region.startswith(b + ".")):
            region = b
        out[b] = {"region": region, "priced": op_signature(n.rstrip("0123456789").rstrip("_") for n in core)}
    return out


# ---- the policy ------------------------------------------------------------------------------------
class _Ids:
    """Identity set of tensors that does not keep them alive (a WeakSet would compare tensors by ==)."""

    def __init__(self):
        self.refs = {}

    def add(self, t):
        self.refs[id(t)] = weakref.ref(t)

    def __contains__(self, t):
        r = self.refs.get(id(t))
        return r is not None and r() is t


# collectives (context parallelism's K/V all-gather, torch's functional collectives): kept, never replayed
_COLLECTIVE_NAMESPACES = ("sapp", "c10d", "_c10d_functional", "_c10d_functional_autograd")


class CorePolicy:
    """SAC policy for one forward of a region: PREFER_RECOMPUTE for the attention core.  The core opens
    at the first matmul of two activations (q.k^T) and closes at the next matmul reading a core tensor
    (att.v, which is kept, as priced); in between an op belongs to the core when it reads a core
    tensor or no activation at all (the causal mask sliced from a buffer), so the copy of v that the
    .v matmul's input needs is not core.

    Outside the core: every GEMM, softmax, norm, random or in-place op, and every op reading no
    activation (factories), is MUST_SAVE -- no priced-as-kept compute runs twice.  Views, copies and
    plain elementwise ops reading activations are PREFER_RECOMPUTE: torch replays the region's prefix
    in recompute anyway, and caching their outputs too would keep tensors autograd never saves (the
    q/k/v copies beside the QKV output they copy), each as large as a core tensor; re-running them is
    a few memory-bound passes.  Both lists are recorded ("ops": the core, "unpriced": the rest).
    Called in forward only (torch replays the decisions in recompute), so it may keep state."""

    def __init__(self, inputs, record: dict | None):
        self.state = "before"
        self.acts, self.core = _Ids(), _Ids()
        for t in inputs:
            if torch.is_tensor(t):
                self.acts.add(t)
        self.record = record
        self.cached_random = False
        self.kept = {}          # id -> (weakref, cached?) of outputs outside the core

    def _keep(self, func, act_in, ins) -> bool:
        name = func.__name__.split(".")[0]
        random = torch.Tag.nondeterministic_seeded in func.tags
        if func._schema.is_mutable and ins:
            # an in-place op follows the tensor it writes: re-applied to a cached tensor it would
            # apply twice, skipped on a recomputed one it would not apply at all
            kept = self.kept.get(id(ins[0]))
            keep = kept is None or kept[0]() is not ins[0] or kept[1]
            if random and not keep:
                raise PlanError(f"selective recomputation would replay random in-place op {name} outside the "
                                f"priced core; use recompute 'full' for this block")
            return keep
        if func in _GEMMS or func in _SOFTMAX or not act_in or random:
            return True
        if getattr(func, "namespace", "") in _COLLECTIVE_NAMESPACES:
            return True         # a collective replayed in backward would be communication nobody priced
        # factories (empty_like ...) are filled in place by the ops after them (dropout's mask)
        return (name.endswith("_like") or name.startswith(("new_", "empty"))
                or "norm" in name or "softmax" in name or "dropout" in name)

    def _mark(self, outs, keep):
        for t in outs:
            self.kept[id(t)] = (weakref.ref(t), keep)

    def __call__(self, ctx, func, *args, **kwargs):
        ins = [t for t in tree_leaves((args, kwargs)) if torch.is_tensor(t)]
        outs = [t for t in tree_leaves(ctx.op_output) if torch.is_tensor(t)]
        act_in = [t for t in ins if t in self.acts]
        core = False
        if self.state == "before" and func in _ACT_MATMULS and len(act_in) >= 2:
            self.state, core = "core", True
        elif self.state == "core":
            reads_core = any(t in self.core for t in ins)
            if func in _ACT_MATMULS and reads_core:
                self.state = "after"
            else:
                core = reads_core or not act_in
        if act_in or core:
            for t in outs:
                self.acts.add(t)
        random = torch.Tag.nondeterministic_seeded in func.tags
        name = func.__name__.split(".")[0]
        if core:
            for t in outs:
                self.core.add(t)
            if random and self.cached_random:
                # the recompute replays random ops from the region's saved RNG state; one skipped
                # (cached) before this one would shift its draws and silently change the mask
                raise PlanError("selective recomputation would recompute a random op after a saved one in the same "
                                "region; use recompute 'full' for this block")
            if self.record is not None:
                self.record["ops"].append(name)
            return CheckpointPolicy.PREFER_RECOMPUTE
        self.cached_random = self.cached_random or random
        keep = self._keep(func, act_in, ins)
        self._mark(outs, keep)
        if keep:
            return CheckpointPolicy.MUST_SAVE
        if self.record is not None and not func.is_view:
            self.record["unpriced"].append(name)
        return CheckpointPolicy.PREFER_RECOMPUTE


def _checkpointed(mod: nn.Module, selective_record: dict | None = None, selective: bool = False) -> None:
    if getattr(mod, "_sapp_checkpointed", False):
        return
    inner = mod.forward
    first = [True]

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        if not selective:
            return checkpoint(inner, *args, use_reentrant=False, **kwargs)
        record = selective_record if first[0] and torch.is_grad_enabled() else None
        first[0] = first[0] and record is None
        policy = CorePolicy(tree_leaves((args, kwargs)), record)
        # allow_cache_entry_mutation: a dropout after the core fills its saved mask in place
        # (empty_like, bernoulli_, div_); the cached final values are the ones backward needs
        def ctx():
            from ..runtime import memory_meter     # a test's meter counts the cache as saved activations
            return memory_meter.meter_sac(create_selective_checkpoint_contexts(policy, allow_cache_entry_mutation=True))
        return checkpoint(inner, *args, use_reentrant=False, context_fn=ctx, **kwargs)

    mod.forward = forward
    mod._sapp_checkpointed = True


def apply(model: nn.Module, modes: dict, regions: dict | None = None) -> dict:
    """Checkpoint the blocks in `modes` (from plan_modes on the whole model) that exist in `model` (a
    pipeline stage holds only some).  `regions`: priced_regions for the selective ones.  Returns
    {block: {"mode", "region", "ops", "unpriced"}}: "ops" and "unpriced" (selective only) are lists the
    first forward fills with the core operators and the cheap others it marked for recomputation."""
    mods = dict(model.named_modules())
    done = {}
    for name, mode in sorted(modes.items()):
        if name not in mods:
            continue
        if mode == "selective":
            reg = (regions or {}).get(name)
            if reg is None:
                raise PlanError(f"recompute: block {name} is planned as selective but has no attention core "
                                f"(two activation matmuls) to recompute; use 'full' or 'none' for it")
            rec = {"ops": [], "unpriced": []}
            if reg["region"] is None:
                done[name] = {"mode": "selective", "region": None, "ops": [], "unpriced": []}
                continue
            _checkpointed(mods[reg["region"]], rec, selective=True)
            done[name] = {"mode": "selective", "region": reg["region"], "ops": rec["ops"], "unpriced": rec["unpriced"]}
        else:
            _checkpointed(mods[name])
            done[name] = {"mode": "full", "region": name}
    return done
