"""Shape audit of a tensor-parallel plan, before the first step: what each rank computes, op by op,
against what the plan implies.

The plan's layout (sapp/search/tp_layout.py) says which op dim every op of a sharded region runs over
the split axis; on a rank that axis holds 1/tp of its global size and every other op is whole.  A
model whose forward reshapes by a number it stored at build time breaks that silently: OPT's
attention views q as `view(bsz, -1, self.num_heads, head_dim)`, so with q column-sharded and
`num_heads` still the global count the `-1` absorbs half the sequence and training goes on with
wrong values.  So before any collective:

1. the model is captured as the search saw it (global shapes) and the sharded regions are found;
2. `localise`: on the module holding a region's linears, integer attributes equal to a size the
   region splits (the openers' out features, the head count a view splits) are set to their local
   value (what a rank of that module must use: OPT's `num_heads`, `embed_dim`; StableLM's, Whisper's);
3. `audit`: the model is captured again with this rank's layer shapes (the stand-ins of
   parallel.local_layers: column-split linears with out/tp features, row-split with in/tp) and every
   op's output shape is compared with the global one with the region's split axis divided by tp.
   The first difference (or a failure to run at the local shapes) is refused as one PlanError line
   naming the module, the op and both shapes.

Capture runs on meta/fake tensors: no weights are read or written and no process talks to another.
What the audit covers: the tensor-parallel regions (with or without a pipeline: a stage runs the
same ops); with `sp_sec`, the sequence cuts and gathers too (sp_audit.py, a plan without a pipeline).
Context and expert parallelism change shapes outside the regions and are checked by their own code
(cp.py, ep.py)."""
from __future__ import annotations

import itertools
import re

from torch import nn

from ...errors import PlanError
from ..recompute.checkpointing import _common_module
from ..tp import local_shapes
from .rank_capture import quiet as _quiet, swapped as _swapped, targets as _targets

# attribute names that can hold a width or a count of heads; counters such as layer_idx never do
_WIDTH_NAME = re.compile(r"head|embed|hidden|dim|size|split|width|channel|feature", re.I)


def sharded_regions(graph, styles: dict, groups, tp: int, model: nn.Module) -> list:
    """The graph's tp regions (tp_layout.Region) whose linears the emitter shards: every opener
    and closer module is a Linear the derived plan splits (parallel._derived_styles)."""
    from ...search import tp_layout
    from ..tp import parallel
    mods = dict(model.named_modules())
    run = parallel._derived_styles(model, dict(mods), styles, groups, None, None, dry=True)
    out = []
    for r in tp_layout.regions(graph, tp):
        if r.why or not r.closers:
            continue
        names = [graph.nodes[n].module for n in r.openers + r.closers]
        if names and all(n in run for n in names):
            out.append(r)
    return out


def expected_local(graph, regions: list, tp: int) -> dict:
    """{node: the output shape one tp rank computes}: the captured shape with the region's split
    axis divided by tp; ops outside the regions are whole."""
    exp = {n: tuple(node.out.shape) for n, node in graph.nodes.items()}
    for r in regions:
        for n, d in r.dims.items():
            node = graph.nodes[n]
            if d in node.out.dims:
                shape = list(exp[n])
                axis = node.out.dims.index(d)
                shape[axis] //= tp
                exp[n] = tuple(shape)
        # a constant repeated over the heads it meets (FAVOR+'s projection), by a rank's head count
        for n, axis in r.bcast.items():
            shape = list(exp[n])
            shape[axis] //= tp
            exp[n] = tuple(shape)
    return exp


def partial_params(graph, regions: list) -> list:
    """Parameters a rank's gradient holds only part of: a replicated weight an op inside a sharded
    region applies to the split axis it lacks (Qwen3's q_norm / k_norm over head_dim, applied to this
    rank's heads).  Backward sums its gradient over this rank's heads only, so each tp rank would step
    its copy with a different partial sum and the copies drift apart; the emitter sums those
    gradients over the tp group (parallel.TPPartialGrads).  The openers' and closers' own weights are
    split (or, for a closer's bias, added after its all-reduce) and are not partial."""
    # weights reach an op through casts and arithmetic of their own (Gemma's `x * (1 + w.float())`):
    # the parameters behind every node computed from parameters and constants alone
    derived = {}
    for name, node in graph.nodes.items():
        acts = [o for o in node.operands if o.param is None and o.producer is not None]
        if node.params and all(o.producer in derived for o in acts):
            derived[name] = set(node.params).union(*(derived[o.producer] for o in acts))
        elif not node.params and acts and all(o.producer in derived for o in acts):
            derived[name] = set().union(*(derived[o.producer] for o in acts))
    out = set()
    for r in regions:
        edge = {graph.nodes[n].module for n in r.openers + r.closers}
        for n, d in r.dims.items():
            node = graph.nodes[n]
            if n in r.openers or n in r.closers or node.module in edge:
                continue
            for op in node.operands:
                if d in op.dims:
                    continue
                if op.param is not None:
                    out.add(op.param)
                elif op.producer in derived:
                    out.update(derived[op.producer])
    # a per-head tensor made outside a region and sliced to a rank's heads where it meets it (ALiBi, a
    # relative-position bias: tp_layout's Region.sliced): the parameters it is made of get this rank's
    # heads' gradient only
    made = _sliced_sources(graph, regions)
    out.update(p for n in made for p in graph.nodes[n].params)
    out.update(graph.nodes[n].operands[j].param for r in regions for n, js in r.sliced.items() for j in js
               if graph.nodes[n].operands[j].param is not None)
    out = {p for p in out if getattr(graph.params.get(p), "trainable", False)}     # not buffers
    # a weight also used whole outside the regions would get that part summed tp times: refused
    inside = {n for r in regions for n in r.dims}
    for name, node in graph.nodes.items():
        if name in inside or name in derived or name in made:
            continue
        used = set(node.params).union(*(derived.get(o.producer, ()) for o in node.operands if o.param is None))
        if used & out:
            p = sorted(used & out)[0]
            raise PlanError(f"tensor parallelism: parameter {p!r} is applied both to a rank's share of a split "
                            f"axis and to whole tensors (op {node.target or node.kind} in module "
                            f"{node.module or '(model)'!r}); sapp cannot sum its gradient right: pin tp=1")
    return sorted(out)


def _sliced_sources(graph, regions: list) -> set:
    """The ops the regions' sliced per-head tensors are made by; PlanError when one of them also
    feeds an op that uses it whole (its parameters' gradient would then be summed tp times)."""
    made, stack, uses = set(), [], set()
    for r in regions:
        for n, js in r.sliced.items():
            for j in js:
                op = graph.nodes[n].operands[j]
                uses.add((n, op.producer or op.param))
                if op.producer is not None:
                    stack.append(op.producer)
    while stack:
        cur = stack.pop()
        if cur not in made:
            made.add(cur)
            stack.extend(o.producer for o in graph.nodes[cur].operands if o.producer is not None)
    consumers = graph.consumers() if made else {}
    for n in made:
        for c, _ in consumers[n]:
            if c not in made and (c, n) not in uses:
                node = graph.nodes[c]
                err = PlanError(f"tensor parallelism: {n!r} is sliced to a rank's heads in a split region and used "
                                f"whole by op {node.target or node.kind} in module {node.module or '(model)'!r}; "
                                f"sapp cannot sum its gradient right: leave the regions slicing it out of "
                                f"tp_modules (sapp search plans them gathered) or pin tp=1")
                err.gather = sorted({graph.nodes[x].module for r in regions if r.sliced for x in r.openers + r.closers})
                raise err
    return made


def candidates(model: nn.Module, graph, regions: list, tp: int) -> dict:
    """{(class, attribute): [(module name, global value)]}: on the innermost module holding a sharded
    region's linears, the int attributes whose name says width/heads and whose value is a size the
    region splits (an opener's out features, the split axis of a view between them).  Generic: read
    off the graph and the module's attributes, not per architecture."""
    out = {}
    for r in regions:
        sizes = set()
        for n, d in r.dims.items():
            node = graph.nodes[n]
            if d in node.out.dims and n not in r.closers:
                sizes.add(int(node.out.shape[node.out.dims.index(d)]))
        owner_name = _common_module([graph.nodes[n].module for n in r.openers + r.closers])
        for name in _holders(owner_name, [graph.nodes[n].module for n in r.openers]):
            owner = model.get_submodule(name) if name else model
            for attr, value in list(vars(owner).items()):
                if (type(value) is int and value > 1 and value in sizes and value % tp == 0
                        and _WIDTH_NAME.search(attr)):
                    out.setdefault((type(owner).__name__, attr), []).append((name, value))
            # einops layers (`Rearrange('b n (h d) -> b h n d', h=heads)`) keep the head count in
            # their axis lengths: x-transformers' and vit-pytorch's attention split heads this way
            for child_name, child in owner.named_children():
                lengths = _einops_lengths(child)
                for axis, value in (lengths or {}).items():
                    if type(value) is int and value > 1 and value in sizes and value % tp == 0:
                        where = f"{name}.{child_name}" if name else child_name
                        out.setdefault((type(child).__name__, f"{child_name}:{axis}"), []).append((where, value))
    return out


def _einops_lengths(module):
    """An einops layer's {axis: length} (its `axes_lengths`), else None."""
    lengths = getattr(module, "axes_lengths", None)
    if (isinstance(lengths, dict) and isinstance(getattr(module, "_axes_lengths", None), tuple)
            and type(module).__module__.startswith("einops.")):
        return lengths
    return None


def _holders(owner: str, openers: list) -> list:
    """`owner` and the modules between it and the openers: the sizes an attention reshapes by live
    where its q/k/v do, which may sit below the module that also holds the closer (BigBird's
    `attention.self` beside `attention.output.dense`)."""
    out = [owner]
    for o in openers:
        parts = o.split(".")[:-1]
        start = len(owner.split(".")) if owner else 0
        for i in range(start + 1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in out:
                out.append(name)
    return out


def _set(model, picked: dict, tp: int, local: bool) -> None:
    for (_, attr), where in picked.items():
        for owner, value in where:
            mod = model.get_submodule(owner) if owner else model
            if ":" in attr:             # an einops layer's axis length: its pattern's recipe is length-free
                axis = attr.split(":", 1)[1]
                mod.axes_lengths[axis] = value // tp if local else value
                mod._axes_lengths = tuple(mod.axes_lengths.items())
            else:
                setattr(mod, attr, value // tp if local else value)


def audit(model: nn.Module, graph, regions: list, local: dict, tp: int, example_inputs: tuple) -> int:
    """Capture `model` with this rank's layer shapes (`local` stand-ins) and compare every op's
    output shape with `expected_local`; PlanError on the first difference.  Returns the ops checked."""
    from ...capture import capture
    from ...errors import CaptureError
    exp = expected_local(graph, regions, tp)
    try:
        with _swapped(model, local), _quiet():
            mine = capture(model, example_inputs, target=_targets(model, example_inputs))
    except CaptureError as e:
        first = str(e).strip().splitlines()[0]
        at = re.search(r"in module '([^']*)'", first)
        mod = at.group(1) if at and at.group(1) != "<root>" else ""
        # the capture's own advice (example inputs) is not the cause here: the global graph captured
        err = _refusal(f"tensor parallelism tp={tp}: {f'module {mod!r}' if mod else 'the model'} cannot run at "
                       f"one rank's shapes ({first.split('; ')[0]})", mod, None, graph, regions)
        err.reached = -1
        raise err from None
    checked = 0
    # ops paired in order, skipping those that vanish where a tensor is already in the layout asked
    # for (CvT's `permute(0, 2, 1, 3).contiguous()` over one local head dispatches nothing): they change
    # no shape, and every op that does is still compared
    ours = [m for m in mine.nodes.values() if str(m.target) not in _LAYOUT_ONLY]
    theirs = [(n, node) for n, node in graph.nodes.items() if str(node.target) not in _LAYOUT_ONLY]
    i = -1
    for n, node in theirs:
        i += 1
        # a per-head tensor narrowed to this rank's heads (local_shapes.Localised): an op the global
        # capture has not, before the op it feeds
        while i < len(ours) and str(ours[i].target) == _NARROWED and str(node.target) != _NARROWED:
            i += 1
        got = ours[i] if i < len(ours) else None
        where = f"module {node.module or '(model)'!r}, op {node.target or node.kind}"
        if got is None or got.target != node.target:
            # a branch on a size (x-transformers' one-key-head path at one key head a rank) runs other
            # code at a rank's shapes: its numerics are not the captured program's to vouch for
            err = _refusal(f"tensor parallelism tp={tp}: at one rank's shapes the model runs other ops than "
                           f"captured ({where} is {'missing' if got is None else got.target})",
                           node.module, n, graph, regions, cause="its code branches on a size the split changes")
        elif tuple(got.out.shape) != exp[n]:
            err = _refusal(f"tensor parallelism tp={tp}: {where} gives {list(got.out.shape)} on a rank where "
                           f"the plan implies {list(exp[n])} (global {list(node.out.shape)})",
                           node.module, n, graph, regions)
        else:
            checked += 1
            continue
        err.reached = checked
        raise err
    return checked


def _refusal(what: str, module: str, node, graph, regions: list,
             cause: str = "it reshapes by a size fixed for the whole model") -> PlanError:
    """The audit's one line, and on it `gather`: the modules of the sharded region the failure sits in
    (the region holding the failing op, else the one whose ops run in the failing module).  sapp's
    search keeps that region replicated and tp on the rest (sapp/emit/runnable.py); a hand-written plan is
    told to leave those layers out."""
    hit = [r for r in regions if node is not None and node in r.dims]
    if not hit and module:
        hit = [r for r in regions if any(graph.nodes[x].module == module or
                                         graph.nodes[x].module.startswith(module + ".") for x in r.dims)]
    mods = sorted({graph.nodes[x].module for r in hit for x in r.openers + r.closers})
    if mods:
        fix = (f"{cause}: leave {', '.join(mods)} out of tp_modules "
               f"(sapp search plans such a block gathered) or pin tp=1")
    else:
        fix = f"{cause}: pin tp=1"
    err = PlanError(f"{what}; {fix}")
    err.gather = mods
    return err


# ops that return their input when it already has the layout asked for (no op recorded then)
_LAYOUT_ONLY = frozenset({"aten.contiguous.default"})
_NARROWED = "aten.narrow.default"

# at most this many leave-one-out tries when setting every candidate fails the audit
MAX_TRIES = 8
SUBSET_TRIES = 3      # every subset of up to this many candidates (7 audits at most)


def check(model: nn.Module, styles: dict, groups, tp: int, example_inputs: tuple, notes: list,
          fix: bool = True, partial: list | None = None, sp_sec: dict | None = None,
          parts: dict | None = None) -> int:
    """Everything above for one rank's tp layout; returns the ops checked (0: nothing sharded).
    The stored sizes set to local values are the candidates' largest set the audit passes: all of
    them, else all but one (a count that equals a head count by chance, e.g. StableLM's rotary_ndims
    at 4 heads), else none - and then the audit's refusal stands.  `fix=False` sets none (what the
    audit catches without it: tests).  `partial` (a list) receives partial_params' names.
    `sp_sec` (the plan's SP section, a plan without a pipeline): the call order is remembered for
    sp_entry's relayout, then the sequence pieces are audited too (sapp/emit/checks/sp_audit.py).
    `parts` (a dict) receives {module: piece sizes} of the fused projections the sharded regions
    split by heads (sapp/emit/tp/fused.py), found on this capture of the model that runs."""
    from ...capture import capture
    from ..tp import parallel
    local = parallel.local_layers(model, styles, tp, groups)
    if not local:
        return 0
    with _quiet():
        graph = capture(model, example_inputs, target=_targets(model, example_inputs))
    if sp_sec:
        from ..tp import sp_entry
        sp_entry.remember_order(model, graph)
    regions = sharded_regions(graph, styles, groups, tp, model)
    if parts is not None:
        for r in regions:
            parts.update({graph.nodes[n].module: list(v) for n, v in r.parts.items()})
    found = partial_params(graph, regions)     # its refusals hold for the search's runnable check too
    if partial is not None:
        partial.extend(found)
    cand = candidates(model, graph, regions, tp) if fix else {}
    tries = _subsets(cand)
    # then the regions' reshapes by sizes of the whole model run at a rank's share, alone and with the
    # stored sizes (nanoGPT's view by `C // self.n_head`, C off the input; litgpt's shared config)
    shapes = local_shapes.rules(graph, regions, tp) if fix else {}
    # last: the grouped-query repeats done before the module that would branch around them at one
    # key head a rank (local_shapes.repeat_rules)
    repeats = local_shapes.repeat_rules(graph, regions, tp, expected_local) if fix else {}
    runs = [(p, False) for p in tries + [{}]] + [(p, True) for p in ([{}] + tries if shapes else [])] + \
        [(p, "repeat") for p in (tries + [{}] if repeats else [])]
    best = None     # the refusal of the try that ran furthest: the cause left once sapp's fixes are in
    for picked, localised in runs:
        _set(model, picked, tp, local=True)
        wrapped = (local_shapes.install_repeats(model, repeats) if localised == "repeat" else
                   local_shapes.install(model, shapes, tp) if localised else [])
        try:
            checked = audit(model, graph, regions, local, tp, example_inputs)
        except PlanError as e:
            _set(model, picked, tp, local=False)
            local_shapes.uninstall(model, wrapped)
            if best is None or getattr(e, "reached", -1) > getattr(best, "reached", -1):
                best = e
            continue
        for (cls, attr), where in sorted(picked.items()):
            notes.append(f"tp: {cls}.{attr} {where[0][1]} -> {where[0][1] // tp} on {len(where)} module(s) "
                         f"(this rank's share of a size the module reshapes by; shape audit passed)")
        if wrapped:
            notes.append(local_shapes.repeat_note(wrapped, tp) if localised == "repeat" else
                         local_shapes.note(wrapped, tp))
        break
    else:
        raise best
    if sp_sec:
        _audit_sp(model, graph, styles, groups, tp, local, example_inputs, sp_sec)
    return checked


def _subsets(cand: dict) -> list:
    """The candidate sets the audit tries, largest first: all; with a few candidates every non-empty
    subset (LocalTransformer's residual-stream count in two einops layers equals its head count at
    4: only the head count is a rank's), else all but one."""
    keys = sorted(cand)
    if not keys:
        return []
    if len(keys) <= SUBSET_TRIES:
        subs = [c for k in range(len(keys), 0, -1) for c in itertools.combinations(keys, k)]
    else:
        subs = [tuple(keys)] + ([tuple(k for k in keys if k != d) for d in keys] if len(keys) <= MAX_TRIES else [])
    return [{k: cand[k] for k in sub} for sub in subs]


def _audit_sp(model, graph, styles, groups, tp, local, example_inputs, sec) -> None:
    """The SP section as sp.apply places it (relayouted in call order, beside the styles the
    regions run) audited at one rank's shapes (sapp/emit/checks/sp_audit.py)."""
    from ..tp import parallel, sp_entry
    from . import sp_audit
    from ..recompute.checkpointing import block_names
    sec = sp_entry.relayout(sec, model, {}, block_names(model))[0]
    run = parallel._derived_styles(model, dict(model.named_modules()), styles, groups, None, None, dry=True,
                                   sp_sec=sec)
    sp_audit.audit(model, graph, sec, run, local, tp, example_inputs)

