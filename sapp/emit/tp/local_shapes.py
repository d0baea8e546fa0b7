"""Reshapes by sizes of the whole model, run at one rank's share (tensor parallelism split by heads).

A sharded region's attention may reshape by sizes it reads off its whole-width input or from a config
every layer shares rather than store on itself: nanoGPT's `c_attn(x).split(self.n_embd, dim=2)` and
`q.view(B, T, self.n_head, C // self.n_head)` with `C` from `x.size()`, litgpt's
`qkv.view(B, T, n_query_groups, total_qkv, head_size)`, `k.expand(B, n_query_groups, ...)` and
`y.reshape(B, T, head_size * n_head)` with the counts read from its Config.  No attribute of the module
gives these a rank's value (the shape audit sets those it stores: sapp/emit/checks/shape_audit.py), so
at one rank's layer shapes such a block cannot run, and the search used to gather it.

Here the module holding the region's linears runs its forward under a TorchFunctionMode
(`Localised`) that rewrites the size arguments of `view` / `reshape` / `expand` / `split` calls naming
the global length of the region's split axis where the rank's tensor holds 1/tp of it.  What it
knows comes off the captured graph (`rules`): each reshaping op of the region, its rank, the axis that
carries the split and that axis's global length; each split of the fused projection, its axis and
global pieces.  A call is rewritten only when it cannot hold at this rank's shapes as given (a view
whose sizes do not multiply to the tensor's, a split whose pieces sum to tp times the axis, an expand
of this rank's one group to tp of them) and exactly one rewrite makes it hold; a whole-width tensor
keeps its call.  The shape audit then compares every op's shape at a rank's layer shapes with the
plan's split, so a rewrite that gives another shape is refused and the block is gathered as before.

A grouped-query repeat that opens a module on its inputs (`repeat_rules`) is done before that module
runs, at a rank's sizes, where the module would otherwise branch around it at one key head a rank
(x-transformers' Attend): the shape audit's last try.

The search's runnable check and the emitter run the same audit (sapp/emit/runnable.py,
sapp/emit/checks/before.py), so the plan the search writes is the program the ranks run."""
from __future__ import annotations

import math

import torch
from torch.overrides import TorchFunctionMode

from ..recompute.checkpointing import _common_module

_FAMILY = {"aten.view.default": "view", "aten.reshape.default": "view", "aten._unsafe_view.default": "view",
           "aten.expand.default": "expand"}


def _empty() -> dict:
    return {"view": set(), "expand": set(), "split": set(), "slice": set()}


_BINARY = {"aten.add.Tensor": "add", "aten.sub.Tensor": "sub", "aten.mul.Tensor": "mul", "aten.div.Tensor": "div"}


def _pattern(graph, node, op, axis=None, tp=1) -> tuple:
    """An operand's shape with the data batch's axes None (another batch size runs) and `axis` / tp."""
    batch = {x.name for x in node.dims if x.batch}
    return tuple(None if d in batch else (s // tp if i == axis else s)
                 for i, (s, d) in enumerate(zip(op.shape, op.dims)))


def _slices(graph, r, tp: int) -> set:
    """(op family, outside operand's pattern, its axis over the split, global length, the split
    operand's pattern at a rank's share) of each per-head tensor a region slices (tp_layout's
    `Region.sliced`: ALiBi's or a relative-position bias)."""
    out = set()
    for n, js in r.sliced.items():
        node = graph.nodes[n]
        d = r.dims[n]
        mine = next((o for o in node.operands if o.producer in r.dims and d in o.dims), None)
        if mine is None or str(node.target) not in _BINARY:
            continue
        for j in js:
            op = node.operands[j]
            axis = op.dims.index(d)
            out.add((_BINARY[str(node.target)], _pattern(graph, node, op), axis, int(op.shape[axis]),
                     _pattern(graph, node, mine, mine.dims.index(d), tp)))
    return out


def rules(graph, regions: list, tp: int) -> dict:
    """{owner module: {"view" / "expand": {(rank, axis, global length)}, "split": {(axis, pieces)}}}
    of the regions (tp_layout.Region) whose ops reshape or split their split axis; the owner is the
    innermost module holding the region's linears."""
    out = {}
    for r in regions:
        got = _empty()
        for n, d in r.dims.items():
            node = graph.nodes[n]
            if n in r.openers or n in r.closers or d not in node.out.dims:
                continue
            axis = node.out.dims.index(d)
            fam = _FAMILY.get(str(node.target))
            length = int(node.out.shape[axis])
            if fam is not None and length % tp == 0:
                got[fam].add((len(node.out.shape), axis, length))
            piece = node.extra.get("piece") if node.kind == "view" else None
            if piece is not None and piece["axis"] == axis and all(s % tp == 0 for s in piece["sizes"]):
                got["split"].add((axis, tuple(int(s) for s in piece["sizes"])))
        got["slice"] = _slices(graph, r, tp)
        if any(got.values()):
            owner = _common_module([graph.nodes[n].module for n in r.openers + r.closers])
            have = out.setdefault(owner, _empty())
            for k, v in got.items():
                have[k] |= v
    return out


def _ints(xs) -> bool:
    return all(type(x) is int for x in xs)


def _sizes(rest):
    """The sizes of `t.view(*sizes)` / `t.view(sizes)`, or None (a dtype, symbolic sizes)."""
    if len(rest) == 1 and isinstance(rest[0], (tuple, list, torch.Size)):
        rest = tuple(rest[0])
    return tuple(rest) if rest and _ints(rest) else None


def _view_holds(numel: int, shape: tuple) -> bool:
    if shape.count(-1) > 1:
        return True                     # torch's own error stands
    known = math.prod(x for x in shape if x != -1)
    return numel == known if -1 not in shape else (known > 0 and numel % known == 0)


def _expand_holds(have: tuple, shape: tuple) -> bool:
    lead = len(shape) - len(have)
    return lead >= 0 and all(s == -1 or h in (1, s) for h, s in zip(have, shape[lead:]))


def _fits(t, pattern) -> bool:
    return t.dim() == len(pattern) and all(p is None or p == s for p, s in zip(pattern, t.shape))


def tp_rank(tp: int) -> int:
    """This process's index on the tp mesh dim (rank = ((pp_i * dp) + dp_i) * tp + tp_i,
    parallel.build_mesh); 0 without a process group (the shape audit on meta: shapes only)."""
    import torch.distributed as dist
    return dist.get_rank() % tp if dist.is_available() and dist.is_initialized() else 0


class Localised(TorchFunctionMode):
    """Rewrites a region's reshapes by global sizes to this rank's share, and slices a per-head tensor
    made outside it to this rank's heads where the two meet (module docstring)."""

    def __init__(self, rule: dict, tp: int, rank: int = 0):
        super().__init__()
        self.rule, self.tp, self.rank = rule, tp, rank

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        call = _CALLS.get(getattr(func, "__name__", ""))
        if call is not None and args and isinstance(args[0], torch.Tensor):
            try:
                fixed = call(self, args, kwargs)
            except Exception:               # noqa: BLE001 - a form not read here runs as given
                fixed = None
            if fixed is not None:
                args, kwargs = fixed
        return func(*args, **kwargs)

    def reshape(self, t, rest, fam: str):
        """The local sizes for `t.view(*rest)` (fam "view") / `t.expand(*rest)`, or None: as given."""
        shape = _sizes(rest)
        if shape is None:
            return None
        lead = len(shape) - t.dim()
        if fam == "view":
            holds, have = _view_holds, t.numel()
        else:
            holds, have = _expand_holds, tuple(t.shape)

        def ours(axis, length):         # an expand of this rank's share of a split axis to the whole
            return fam == "view" or (axis >= lead and t.shape[axis - lead] * self.tp == length)

        found = [(axis, length) for rank, axis, length in self.rule[fam]
                 if len(shape) == rank and shape[axis] == length and ours(axis, length)]
        # as given it holds: kept, except an expand of this rank's one group to tp (a singleton broadcasts)
        if holds(have, shape) and (fam == "view" or not found):
            return None
        picks = {shape[:a] + (n // self.tp,) + shape[a + 1:] for a, n in found}
        picks = {p for p in picks if holds(have, p)}
        return picks.pop() if len(picks) == 1 else None

    def sliced(self, fam: str, a, b, inplace: bool):
        """(a, b) with the one that is a per-head tensor of the rule at its global length narrowed to
        this rank's heads, where the other is the region's split at a rank's share; None: as given."""
        pairs = [(1, b, a)] + ([] if inplace else [(0, a, b)])
        for which, whole, mine in pairs:
            if not (isinstance(whole, torch.Tensor) and isinstance(mine, torch.Tensor)):
                continue
            for f, pat, axis, length, mine_pat in self.rule.get("slice", ()):
                lead = mine.dim() - whole.dim()
                if (f == fam and _fits(whole, pat) and _fits(mine, mine_pat) and lead >= 0
                        and mine.shape[axis + lead] * self.tp == length):
                    part = whole.narrow(axis, self.rank * (length // self.tp), length // self.tp)
                    return (a, part) if which == 1 else (part, b)
        return None

    def split(self, t, sizes, dim):
        """The local pieces for `t.split(sizes, dim)`, or None: as given."""
        if type(dim) is not int or not -t.dim() <= dim < t.dim():
            return None
        dim %= t.dim()
        for axis, pieces in self.rule["split"]:
            if axis != dim or t.shape[dim] * self.tp != sum(pieces):
                continue
            if type(sizes) is int and all(s == sizes for s in pieces[:-1]) and pieces[-1] <= sizes:
                return sizes // self.tp if sizes % self.tp == 0 else None
            if isinstance(sizes, (list, tuple)) and _ints(sizes) and tuple(sizes) == pieces:
                return [s // self.tp for s in sizes]
        return None


def _reshape_call(fam):
    def call(mode, args, kwargs):
        if kwargs:
            return None
        new = mode.reshape(args[0], args[1:], fam)
        return None if new is None else ((args[0], new), {})
    return call


def _split_call(mode, args, kwargs):
    rest = dict(kwargs)
    sizes = args[1] if len(args) > 1 else rest.pop("split_size", rest.pop("split_size_or_sections", None))
    dim = args[2] if len(args) > 2 else rest.pop("dim", 0)
    if rest or sizes is None or len(args) > 3:
        return None
    new = mode.split(args[0], sizes, dim)
    return None if new is None else ((args[0], new, dim), {})


def _binary_call(fam, inplace=False):
    def call(mode, args, kwargs):
        if len(args) != 2 or not mode.rule.get("slice"):
            return None
        new = mode.sliced(fam, args[0], args[1], inplace)
        return None if new is None else (new, kwargs)
    return call


_CALLS = {"view": _reshape_call("view"), "reshape": _reshape_call("view"), "expand": _reshape_call("expand"),
          "split": _split_call, "split_with_sizes": _split_call}
for _fam, _names in {"add": ("add", "__add__", "__radd__"), "sub": ("sub", "__sub__", "__rsub__"),
                     "mul": ("mul", "__mul__", "__rmul__"), "div": ("div", "__truediv__", "__rtruediv__")}.items():
    _CALLS.update({n: _binary_call(_fam) for n in _names})
    _CALLS.update({n: _binary_call(_fam, inplace=True) for n in (f"{_fam}_", f"__i{_fam}__")})
_CALLS["__itruediv__"] = _binary_call("div", inplace=True)


class _Forward:
    """A module's forward run under `Localised` (set as the instance's `forward`)."""

    def __init__(self, forward, rule: dict, tp: int):
        self.forward, self.rule, self.tp = forward, rule, tp

    def __call__(self, *args, **kwargs):
        with Localised(self.rule, self.tp, tp_rank(self.tp)):
            return self.forward(*args, **kwargs)


def install(model, found: dict, tp: int) -> list:
    """Run each owner module of `found` (`rules`) under `Localised`; returns the names wrapped."""
    done = []
    for name, rule in sorted(found.items()):
        mod = model.get_submodule(name) if name else model
        if not isinstance(mod.__dict__.get("forward"), _Forward):
            mod.forward = _Forward(mod.forward, rule, tp)
            done.append(name)
    return done


def uninstall(model, names: list) -> None:
    for name in names:
        mod = model.get_submodule(name) if name else model
        if isinstance(mod.__dict__.get("forward"), (_Forward, _Repeated)):
            del mod.forward


_REPEAT = ("aten.unsqueeze.default", "aten.expand.default", "aten.reshape.default")


def repeat_rules(graph, regions: list, tp: int, expected) -> dict:
    """{module: [(input pattern at a rank's share, unsqueezed axis, repeat)]}: the grouped-query
    repeats (`b kvh n d -> b (r kvh) n d`: unsqueeze, expand, reshape; search/tp_regroup.py) that open
    a module on one of its inputs, in graph order.  At one key head a rank a library may branch
    around its repeat (x-transformers' Attend flattens a lone key head to 'b n d' and broadcasts it),
    running other ops than captured; done here before the module runs, at a rank's sizes, the repeat
    is the captured ops again and the module sees as many key heads as query heads, which it reads
    without a repeat of its own.  The shape audit compares every op, so a library that does anything
    else is still gathered.  `expected(graph, regions, tp)`: each node's shape at a rank
    (shape_audit.expected_local, passed in: the audit imports this module)."""
    from ...search.tp_regroup import regroups
    exp = None
    out = {}
    for r in regions:
        for name in regroups(graph, r.dims):
            node = graph.nodes[name]
            chain = [node]
            while len(chain) < 3 and chain[-1].operands and chain[-1].operands[0].producer:
                chain.append(graph.nodes[chain[-1].operands[0].producer])
            chain.reverse()
            if tuple(str(c.target) for c in chain) != _REPEAT or len({c.module for c in chain}) != 1:
                continue
            src = chain[0].operands[0]
            if src.producer is None or _inside(graph.nodes[src.producer].module, node.module):
                continue            # the repeat does not read one of the module's inputs
            ushape, eshape = chain[0].out.shape, chain[1].out.shape
            axis = next((i for i in range(len(ushape)) if ushape[i] == 1 and
                         tuple(ushape[:i]) + tuple(ushape[i + 1:]) == tuple(src.shape)), None)
            exp = exp if exp is not None else expected(graph, regions, tp)
            if axis is None or exp[chain[1].name][axis] != eshape[axis]:
                continue
            pout = graph.nodes[src.producer].out.dims
            if r.dims.get(src.producer) not in pout:
                continue
            split = pout.index(r.dims[src.producer])
            pattern = _pattern(graph, chain[0], src, split, tp)
            out.setdefault(node.module, []).append((pattern, axis, eshape[axis]))
    return out


def _inside(module: str, owner: str) -> bool:
    return module == owner or module.startswith(owner + ".")


class _Repeated:
    """A module's forward with its inputs' grouped-query repeats done first (`repeat_rules`)."""

    def __init__(self, forward, rules: list):
        self.forward, self.rules = forward, rules

    def __call__(self, *args, **kwargs):
        keys = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)] + \
               [k for k, a in kwargs.items() if isinstance(a, torch.Tensor)]
        get = lambda k: args[k] if isinstance(k, int) else kwargs[k]    # noqa: E731
        args = list(args)
        for pattern in {p for p, _, _ in self.rules}:
            if sum(1 for k in keys if _fits(get(k), pattern)) != sum(1 for p, _, _ in self.rules if p == pattern):
                return self.forward(*args, **kwargs)    # which input is which is not clear: as it is
        for pattern, axis, times in self.rules:        # in graph order: the inputs' order
            k = next(k for k in keys if _fits(get(k), pattern))
            keys.remove(k)
            t = get(k).unsqueeze(axis)
            t = t.expand(*[times if i == axis else s for i, s in enumerate(t.shape)])
            shape = list(t.shape)
            t = t.reshape(*shape[:axis], shape[axis] * shape[axis + 1], *shape[axis + 2:])
            if isinstance(k, int):
                args[k] = t
            else:
                kwargs[k] = t
        return self.forward(*args, **kwargs)


def install_repeats(model, found: dict) -> list:
    """Each module of `found` (`repeat_rules`) repeats its inputs' key heads before it runs."""
    done = []
    for name, rules in sorted(found.items()):
        mod = model.get_submodule(name) if name else model
        if not isinstance(mod.__dict__.get("forward"), (_Forward, _Repeated)):
            mod.forward = _Repeated(mod.forward, rules)
            done.append(name)
    return done


def repeat_note(names: list, tp: int) -> str:
    from ...search.tp_layout import gather_pattern
    pats = sorted({gather_pattern(n) for n in names})
    return (f"tp: {', '.join(pats)} get their key / value heads repeated to this rank's query heads before they "
            f"run (one key head a rank at tp={tp}, where the code branches around its own repeat): the "
            f"captured ops at a rank's sizes (shape audit passed)")


def note(names: list, tp: int) -> str:
    from ...search.tp_layout import gather_pattern
    pats = sorted({gather_pattern(n) for n in names})
    return (f"tp: {', '.join(pats)} reshape by sizes of the whole model (read off the input or a shared config): "
            f"split by heads, those reshapes run at this rank's 1/{tp} (shape audit passed)")
