"""Sequence-parallel shape audit, before the first step: the model run once at one rank's shapes with
the plan's sequence cuts and gathers where sp.apply puts them (after sp_entry's relayout, with the
call order the shape audit's capture gave), on fake tensors, no rank talking to another.

Code between a cut and the next gather sees the shard's length as the sequence's.  Where it builds
something for the whole sequence from that length (an HF attention mask from the embedding output:
CamemBERT / XLM-RoBERTa, ERNIE, XLM-RoBERTa-XL) the step failed at step 0 with "size of tensor a (16)
must match the size of tensor b (8)" after every rank had set up its collectives; here that run fails
first and is refused as one PlanError line naming the module and the error.  The model's output
must also come out with its captured shape (an LM head gathers the sequence back).

What each piece does at one rank's shapes (the tp stand-ins of parallel.local_layers already in
place: a row-split closer's output is whole there, as after its all-reduce):
    scatter, block_scatter, a norm cut at its input (sp._late_cuts), exits   keep the first 1/tp of the
        sequence axis (a local slice; a reduce-scatter's output has that shape)
    entries                                                                  the input repeated tp times
        along the axis (an all-gather's output shape)
    norms                                                                    nothing: they run on what
        arrives
Only shapes are checked: the values are fake."""
from __future__ import annotations

import torch

from ...errors import PlanError


def _pieces(model, sec: dict, tp_plan: dict) -> list:
    """[(module name, "pre" | "post", "cut" | "gather", axis)] as sp.apply places them."""
    from ..tp import sp
    mods = dict(model.named_modules())
    scatter, late = sp._late_cuts(sec, mods, tp_plan)
    out = [(n, "post", "cut", a) for n, a in scatter.items()]
    out += [(n, "pre", "cut", a) for n, a in late.items()]
    out += [(n, "pre", "cut", a) for n, a in (sec.get("block_scatter") or {}).items()]
    # an exit reduce-scatters only as a row-split layer the regions run (sp.adjust)
    out += [(n, "post", "cut", a) for n, a in (sec.get("exits") or {}).items() if tp_plan.get(n) == "rowwise"]
    out += [(n, "pre", "gather", a) for n, a in (sec.get("entries") or {}).items()]
    return [p for p in out if p[0] in mods]


def _move(x, kind: str, axis: int, tp: int):
    if kind == "gather":
        return torch.cat([x] * tp, dim=axis)
    return x.narrow(axis, 0, x.shape[axis] // tp)


def _pre(kind, axis, tp):
    from ..tp.sp import _pick

    def hook(mod, args, kwargs):
        i = _pick(args, kwargs, axis)
        if i is None:
            raise PlanError(f"sequence parallelism: {type(mod).__name__} got no tensor input to "
                            f"{kind}; search again with sp pinned to false")
        if isinstance(i, int):
            return args[:i] + (_move(args[i], kind, axis, tp),) + tuple(args[i + 1:]), kwargs
        return args, dict(kwargs, **{i: _move(kwargs[i], kind, axis, tp)})
    return hook


def _post(kind, axis, tp):
    def hook(mod, args, out):
        return _move(out, kind, axis, tp) if torch.is_tensor(out) else out
    return hook


def _failure(e, fallback) -> tuple:
    """(module, error line): capture's wording names the innermost module and the op's error, then
    adds a hint about inputs that is not the cause here; others: the module _Where saw fail."""
    import re
    line = " ".join(str(e).split()) or type(e).__name__
    m = re.search(r" in module '([^']*)' \([^)]*\): (.*); [^;]*$", line)
    return (m.group(1), m.group(2)) if m else (fallback, line)


def _shapes(graph) -> list:
    return [tuple(graph.nodes[n].out.shape) for n in graph.outputs]


def audit(model, graph, sec: dict, tp_plan: dict, local: dict, tp: int, example_inputs: tuple) -> None:
    """Capture `model` at one rank's layer shapes (`local` stand-ins) with the SP pieces of `sec` (the
    section sp.apply will place) simulated; PlanError naming the module where that fails, or when the
    output's shapes differ from `graph`'s (the global capture)."""
    from ...capture import capture
    from ...errors import CaptureError
    from .preflight import _Where
    from .rank_capture import quiet as _quiet, swapped as _swapped, targets as _targets
    handles, where = [], None
    try:
        with _swapped(model, local), _quiet():
            for name, when, kind, axis in _pieces(model, sec, tp_plan):
                mod = model.get_submodule(name) if name else model       # a stand-in where swapped
                if when == "pre":
                    handles.append(mod.register_forward_pre_hook(_pre(kind, axis, tp), with_kwargs=True))
                else:
                    handles.append(mod.register_forward_hook(_post(kind, axis, tp)))
            where = _Where(model)
            mine = capture(model, example_inputs, target=_targets(model, example_inputs))
    except (CaptureError, PlanError, RuntimeError, ValueError, IndexError, TypeError) as e:
        if where is not None:
            where.close()
        module, line = _failure(e, where.failed if where else None)
        raise PlanError(f"sequence parallelism tp={tp}: at one rank's sequence shard the model fails in module "
                        f"{module or '(model)'!r} ({line[:300]}): code there reads the shard's length as the "
                        f"sequence's; search again with sp pinned to false (constraints sp=false)") from None
    finally:
        if where is not None:
            where.close()
        for h in handles:
            h.remove()
    if _shapes(mine) != _shapes(graph):
        raise PlanError(f"sequence parallelism tp={tp}: at one rank's sequence shard the model's output has "
                        f"shapes {_shapes(mine)}, the plan implies {_shapes(graph)}; search again with sp pinned "
                        f"to false (constraints sp=false)")
