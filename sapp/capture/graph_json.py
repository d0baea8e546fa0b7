"""An OpGraph as JSON data and back, exactly: the capture cache's payload (sapp/capture/cache.py).

Rows are positional lists (a node is [name, kind, target, dims, operands, out, flops, bytes, saves,
module, block, extra]) so a 3,000-node graph stays a few MB and loads in well under a second.  JSON
keeps ints and floats apart and floats exact (repr round-trips); the free-form `extra` / `meta`
values keep their Python types through a tag for tuples (`{"__tuple__": [...]}`) and for dicts whose
keys are not all strings (`{"__dict__": [[k, v], ...]}`).  A value of any other type cannot be stored
(`Unstorable`: that graph is not cached).  Reading checks every row's shape and types: a file that
does not decode into a well-formed graph raises ValueError, never a half-read graph.  Pure Python."""
from __future__ import annotations

from sapp.capture.ir import Dim, OpGraph, OpNode, Operand, ParamInfo, TensorSpec

FORMAT = 2       # 2: meta may carry `batch_buffers` (capture/batchy.py); a format-1 entry lacks it


class Unstorable(ValueError):
    """A graph holding a value JSON cannot carry exactly."""


# ---- free-form values (extra, meta) -------------------------------------------------------------
def _enc(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, tuple):
        return {"__tuple__": [_enc(x) for x in v]}
    if isinstance(v, list):
        return [_enc(x) for x in v]
    if isinstance(v, dict):
        if all(isinstance(k, str) for k in v) and "__tuple__" not in v and "__dict__" not in v:
            return {k: _enc(x) for k, x in v.items()}
        return {"__dict__": [[_enc(k), _enc(x)] for k, x in v.items()]}
    raise Unstorable(f"{type(v).__name__} value")


def _dec(v):
    if isinstance(v, list):
        return [_dec(x) for x in v]
    if isinstance(v, dict):
        if len(v) == 1 and "__tuple__" in v:
            return tuple(_dec(x) for x in _list(v["__tuple__"]))
        if len(v) == 1 and "__dict__" in v:
            out = {}
            for pair in _list(v["__dict__"]):
                k, x = _list(pair, 2)
                out[_hashable(_dec(k))] = _dec(x)
            return out
        return {k: _dec(x) for k, x in v.items()}
    return v


def _hashable(k):
    hash(k)                      # a list key would raise TypeError: not a graph we wrote
    return k


# ---- checked readers ----------------------------------------------------------------------------
def _list(v, n=None):
    if not isinstance(v, list) or (n is not None and len(v) != n):
        raise ValueError("malformed graph row")
    return v


def _str(v, none=False):
    if isinstance(v, str) or (none and v is None):
        return v
    raise ValueError("malformed graph string")


def _int(v):
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    raise ValueError("malformed graph integer")


def _num(v):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    raise ValueError("malformed graph number")


def _bool(v):
    if isinstance(v, bool):
        return v
    raise ValueError("malformed graph flag")


def _shape(v):
    return tuple(_int(x) for x in _list(v))


def _axes(v):
    return tuple(_str(x, none=True) for x in _list(v))


# ---- the graph ----------------------------------------------------------------------------------
def to_data(g: OpGraph) -> dict:
    nodes = []
    for n in g.nodes.values():
        nodes.append([n.name, n.kind, n.target, [[d.name, d.size, d.splittable, d.batch] for d in n.dims],
                      [[list(o.shape), o.dtype, list(o.dims), o.producer, o.param] for o in n.operands],
                      [list(n.out.shape), n.out.dtype, list(n.out.dims)], n.flops, n.bytes, list(n.saves),
                      n.module, n.block, _enc(n.extra)])
    params = [[q, p.name, list(p.shape), p.dtype, p.module, p.trainable, p.sparse_grad] for q, p in g.params.items()]
    for row in nodes:                                   # the fixed fields hold their declared types
        if not all(isinstance(x, (int, float)) for x in row[6:8]) or row[10] is not None and not isinstance(row[10], str):
            raise Unstorable("node field")
    return {"format": FORMAT, "name": _enc(g.name), "outputs": _enc(g.outputs), "batch_size": g.batch_size,
            "blocks": _enc(g.blocks), "block_groups": _enc(g.block_groups), "meta": _enc(g.meta),
            "params": params, "nodes": nodes}


def from_data(d) -> OpGraph:
    """The graph `to_data` wrote; ValueError (or TypeError/KeyError from a malformed row) otherwise."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ValueError("not a graph of this format")
    nodes = {}
    for row in _list(d["nodes"]):
        name, kind, target, dims, ops, out, flops, nbytes, saves, module, block, extra = _list(row, 12)
        dims = tuple(Dim(_str(a), _int(b), _bool(c), _bool(e)) for a, b, c, e in (_list(x, 4) for x in _list(dims)))
        operands = tuple(Operand(_shape(s), _str(t), _axes(ax), _str(p, True), _str(q, True))
                         for s, t, ax, p, q in (_list(o, 5) for o in _list(ops)))
        s, t, ax = _list(out, 3)
        extra = _dec(extra)
        if not isinstance(extra, dict) or _str(name) in nodes:
            raise ValueError("malformed graph node")
        nodes[name] = OpNode(name, _str(kind), _str(target), dims, operands, TensorSpec(_shape(s), _str(t), _axes(ax)),
                             _num(flops), _num(nbytes), tuple(_str(x) for x in _list(saves)), _str(module),
                             _str(block, True), extra)
    params = {}
    for row in _list(d["params"]):
        q, name, shape, dtype, module, trainable, sparse = _list(row, 7)
        params[_str(q)] = ParamInfo(_str(name), _shape(shape), _str(dtype), _str(module), _bool(trainable), _bool(sparse))
    outputs, blocks, groups, meta = (_dec(d[k]) for k in ("outputs", "blocks", "block_groups", "meta"))
    if not (isinstance(outputs, tuple) and isinstance(blocks, dict) and isinstance(groups, list)
            and isinstance(meta, dict)) or any(p is not None and p not in nodes for n in nodes.values() for p in n.producers):
        raise ValueError("malformed graph")
    return OpGraph(_dec(d["name"]), nodes, params, outputs, _int(d["batch_size"]), blocks, groups, meta)
