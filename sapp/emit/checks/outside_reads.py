"""Reads of a split weight outside the module that splits it, found before the first step.

Tensor parallelism makes a split layer's weight a DTensor, and the layer's own forward knows how to
compute with it.  Model code that reads the weight anywhere else meets a DTensor where it expects the
whole table: Gemma 4's multimodal forward takes `embed_tokens.weight[pad_id]` for a branch whose
result it never uses, so the captured graph (and with it the search and the shape audit) never sees
the read, and the first step stops with DTensor's "got mixed torch.Tensor and DTensor".  A live read
of the same kind (a head computed as `h @ embed.weight.T` in the parent's forward) would stop the
same way.

So before any process group or collective the model's forward runs once on fake tensors (shapes only,
no compute; the weights are read, never written, and what the forward caches on its modules is put
back as it was; the search's meta copy runs on meta) under a torch-function mode that sees every call
taking one of the split layers' parameters, and the module running when it happens (global forward
hooks).  A call from any module but one holding that parameter is refused in one line naming the
module, the parameter and the op.  Metadata reads (shape, dtype, device, dim) are answered by a
DTensor as by the whole tensor and pass.

Only the eager model is checked: a pipeline stage runs the traced graph, which holds no dead read,
and a live one in it is a use the layout already sees.  A forward that cannot run on fake tensors
(a value read back to Python, say) proves nothing either way: the check stands aside, and the
shape audit and the step's own errors remain."""
from __future__ import annotations

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from ...errors import PlanError

# calls and properties that read only a tensor's metadata, which a DTensor answers for the whole tensor
_METADATA = frozenset({"size", "dim", "ndimension", "numel", "nelement", "element_size", "stride",
                       "is_floating_point", "is_complex", "is_contiguous", "__len__", "requires_grad_",
                       "shape", "dtype", "device", "ndim", "requires_grad", "is_leaf", "layout",
                       "is_cuda", "is_meta", "is_cpu", "is_sparse", "is_quantized", "names", "itemsize"})


def _name(func) -> str:
    """The call's name; a property read arrives as its getter and is named by the property (`.T`
    is a read of the data, `.shape` is not)."""
    name = getattr(func, "__name__", None) or str(func)
    if name == "__get__":
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name


class _Reads(TorchFunctionMode):
    """Records the first call that takes a watched parameter from a module not holding it."""

    def __init__(self, watched: dict, stack: list):
        super().__init__()
        self.watched, self.stack, self.found = watched, stack, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        if self.found is None and name not in _METADATA:
            for t in tree_leaves((args, kwargs)):
                seen = self.watched.get(id(t))
                if seen is not None and seen[0] is t:
                    mod, where = self.stack[-1] if self.stack else (None, "")
                    if mod is None or id(mod) not in seen[2]:
                        self.found = (where, type(mod).__name__ if mod is not None else "", seen[1], name)
                        break
        return func(*args, **kwargs)


def watched_params(model: nn.Module, split: list) -> dict:
    """{id(p): (p, qualified name, ids of every module holding p)} for the direct parameters of the
    modules named in `split`."""
    holders, names = {}, {}
    for path, mod in model.named_modules(remove_duplicate=False):
        for pname, p in mod.named_parameters(recurse=False):
            holders.setdefault(id(p), set()).add(id(mod))
            names.setdefault(id(p), []).append(f"{path}.{pname}" if path else pname)
    mods = dict(model.named_modules())
    out = {}
    for name in split:
        mod = mods.get(name)
        if mod is None:
            continue
        for p in mod.parameters(recurse=False):
            # a tied weight by every name it has: the model's code may read it by any of them
            out.setdefault(id(p), (p, " = ".join(sorted(set(names[id(p)]))), holders[id(p)]))
    return out


def find(model: nn.Module, split: list, example_inputs: tuple):
    """(module path, module class, parameter, op) of the first read of a parameter of the `split`
    modules outside a module holding it, None when there is none or the forward cannot run on fake
    tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    watched = watched_params(model, split)
    if not watched:
        return None
    paths = {id(m): n or "(model)" for n, m in model.named_modules()}
    stack = []

    def enter(mod, args):
        stack.append((mod, paths.get(id(mod), type(mod).__name__)))

    def leave(mod, args, out):
        if stack:
            stack.pop()

    from torch.nn.modules import module as module_hooks
    handles = [module_hooks.register_module_forward_pre_hook(enter),
               module_hooks.register_module_forward_hook(leave)]
    reads = _Reads(watched, stack)
    kept = _state(model)
    try:
        if _all_meta(model, example_inputs) and _run(model, example_inputs, reads, stack):
            return reads.found
        # real weights, or a forward meta tensors cannot run (a value read back to Python): fake
        # tensors, with unbacked sizes for data-dependent ops (static input shapes: symbolic ones
        # make every op several times slower)
        with FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv(), static_shapes=True) as fake:
            reads.watched = _fake_state(model, fake, watched)
            inputs = tuple(fake.from_tensor(x) if torch.is_tensor(x) else x for x in example_inputs)
            _run(model, inputs, reads, stack)
    finally:
        for h in handles:
            h.remove()
        _restore(kept)
    return reads.found


def _state(model) -> list:
    """Every module's attributes, buffers, parameters and children as they are: a forward may cache
    what it computes on the module (x-transformers' ALiBi registers its bias as a buffer, HF rotary
    layers keep cos/sin tables), and a fake or meta tensor left there would meet the real step."""
    return [(m, dict(m.__dict__), dict(m._buffers), dict(m._parameters), dict(m._modules))
            for m in model.modules()]


def _restore(kept: list) -> None:
    for m, attrs, buffers, params, children in kept:
        for key in [k for k in m.__dict__ if k not in attrs]:
            del m.__dict__[key]
        m.__dict__.update(attrs)
        for d, was in ((m._buffers, buffers), (m._parameters, params), (m._modules, children)):
            d.clear()
            d.update(was)


def _fake_state(model, fake, watched: dict) -> dict:
    """Every parameter and buffer swapped for a fake one (a weight tied under two names keeps one
    fake), so whatever the forward writes in place lands on a fake tensor; `_restore` puts the real
    ones back.  Returns `watched` keyed by the fakes."""
    fakes = {}
    for m in model.modules():
        for d in (m._parameters, m._buffers):
            for k, t in list(d.items()):
                if t is not None:
                    if id(t) not in fakes:
                        fakes[id(t)] = fake.from_tensor(t)
                    d[k] = fakes[id(t)]
    return {id(fakes[i]): (fakes[i], name, holders) for i, (_, name, holders) in watched.items() if i in fakes}


def _all_meta(model, example_inputs) -> bool:
    """Parameters, buffers and inputs all on meta (the search's copy): the forward runs on meta
    directly, about 3x faster than on fake tensors."""
    return all(t.device.type == "meta" for t in (*model.parameters(), *model.buffers(),
                                                  *(x for x in example_inputs if torch.is_tensor(x))))


def _run(model, inputs, reads, stack) -> bool:
    """One forward under `reads`; False when it raised before finding a read."""
    stack.clear()
    try:
        with reads, torch.no_grad():
            model(*inputs)
    except Exception:           # noqa: BLE001 - a forward that cannot run here proves nothing
        return reads.found is not None
    return True


def check(model: nn.Module, split: list, tp: int, example_inputs: tuple) -> None:
    """PlanError when the model's forward reads a split layer's parameter outside the layer."""
    found = find(model, split, example_inputs)
    if found is None:
        return
    where, cls, param, op = found
    owners = ", ".join(n.rpartition(".")[0] for n in param.split(" = "))
    raise PlanError(f"tensor parallelism tp={tp}: {cls or 'the model'} {where!r} reads {param} ({op}) outside "
                    f"the layer holding it, which the plan splits, so it would get one rank's DTensor share; "
                    f"pin tp=1 or leave {owners} out of the plan's tp_modules")


def check_plan(model: nn.Module, plan, example_inputs: tuple, with_sp: bool = True) -> None:
    """`check` for the layers a plan without a pipeline splits: the tp groups' layers as the emitter
    derives them (sapp/emit/tp/parallel.py) and, with `with_sp`, the norms sequence parallelism makes
    Replicate DTensors (read elsewhere, they mix as a split weight does)."""
    from ..recompute.checkpointing import block_names
    from ..tp import parallel, sp as sp_mod, sp_entry
    from . import plan as checks
    sec = sp_mod.section(plan) if with_sp else {}
    if sec:
        sec = sp_entry.relayout(sec, model, {}, block_names(model))[0]
    split = parallel._derived_styles(model, dict(model.named_modules()), checks.tp_modules(plan),
                                     checks.tp_groups(plan), None, None, dry=True, sp_sec=sec or None)
    check(model, sorted(set(split) | set((sec or {}).get("norms", {}))), plan.parallel["tp"], example_inputs)
