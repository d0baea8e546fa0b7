"""The vocabulary of op handlers: what a handler receives (`OpCall`, its tensor inputs `Tin`, `TRef`
placeholders for tensors among the arguments) and returns (`Spec`), the helpers every op family
shares, and `generic` - the rule for an op no family knows (priced at one FLOP per output element,
only batch dims splittable, and flagged so the plan names it)."""
from __future__ import annotations

from dataclasses import dataclass, field

@dataclass
class Tin:
    """One tensor input of an op call."""
    shape: tuple
    dtype: str
    is_param: bool = False
    is_act: bool = False          # produced by another node (an activation)
    batch: tuple = ()             # per axis: carries the data batch (routing ops index per shard)


@dataclass
class OpCall:
    op: str                       # ATen packet name without trailing "_" of in-place variants
    ins: list                     # [Tin] in argument order
    args: tuple                   # positional args, tensors replaced by their index in `ins` (TRef)
    kwargs: dict
    out_shape: tuple
    out_dtype: str


@dataclass(frozen=True)
class TRef:
    i: int


@dataclass
class Spec:
    kind: str
    dims: list                    # [(name, size, splittable)]
    in_dims: list                 # per input: tuple of dim name or None per axis
    out_dims: tuple
    flops: float = 0.0
    saves: tuple = ()
    copies: bool = True           # False: a pure view, moves no bytes
    also: list = field(default_factory=list)   # extra (input, axis, dim) links, for batch flags only
    extra: dict = field(default_factory=dict)
    generic: bool = False         # unknown op: only batch dims may be split
    trusted: bool = False         # mapping may link axes of different sizes on purpose (reshape)
    local: list = field(default_factory=list)  # dims splittable exactly when they carry the data batch


def prod(xs):
    n = 1
    for x in xs:
        n *= int(x)
    return n


def _arg(c, i, name=None, default=None):
    if len(c.args) > i:
        return c.args[i]
    return c.kwargs.get(name, default)


def _axis(d, n):
    return d + n if d < 0 else d


def _adims(shape, unsplit=()):
    return [(f"a{i}", int(s), i not in unsplit) for i, s in enumerate(shape)]


def _bcast(tin_shape, out_shape):
    """Right-aligned broadcast mapping of an input onto output axes a<i>."""
    r, n = len(out_shape), len(tin_shape)
    dims = []
    for j, s in enumerate(tin_shape):
        i = r - n + j
        dims.append(f"a{i}" if 0 <= i < r and s == out_shape[i] and s != 1 else None)
    return tuple(dims)


def _act_saves(c, idxs):
    return tuple(f"in{i}" for i in idxs if i < len(c.ins) and c.ins[i].is_act)



def _bias_dims(shape, out_dims):
    r, n = len(out_dims), len(shape)
    return tuple(out_dims[r - n + j] if s != 1 else None for j, s in enumerate(shape))


def generic(c):
    """Unknown op: output axes a<i>; inputs of the output's shape map straight, others broadcast
    where sizes agree.  Only batch dims are splittable (set after batch propagation)."""
    r = c.out_shape
    return Spec("other", _adims(r), [_bcast(t.shape, r) for t in c.ins], tuple(f"a{i}" for i in range(len(r))),
                float(prod(r)), _act_saves(c, list(range(len(c.ins)))), generic=True)
