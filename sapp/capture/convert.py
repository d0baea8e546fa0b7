"""ATen fx graph (from torch.export) -> OpGraph nodes.

Walks the graph once.  Parameters/buffers become operand qualnames (from the export signature),
user inputs become `input` nodes, every tensor-producing call becomes an OpNode whose dims come from
sapp.capture.ops.  Batch axes start at axis 0 of the inputs and flow through the dim mappings."""
from __future__ import annotations

import operator
import re

import torch

from sapp.capture.ir import Dim, OpNode, Operand, ParamInfo, TensorSpec
from .ops import OpCall, Tin, TRef, spec_for

SPLIT_OPS = {"split", "split_with_sizes", "chunk", "unbind", "tensor_split", "unsafe_split"}
# Ops that only check or annotate; they produce no tensor the model computes with.
# Higher-order ops that run a subgraph under a mode: position of the subgraph among their args.
INLINE_HOPS = {"wrap_with_set_grad_enabled": 1, "wrap_with_autocast": 4}
# Ops that return their input unchanged when dtype, shape and device already match.
ALIAS_OPS = {"to", "type_as", "alias", "detach"}
# `x @ W.T` (Falcon's FalconLinear, `aten.numpy_T`) / `x @ W.t()`: with W a 2-D parameter (n, k) the
# pair is the linear F.linear(x, W) computes; captured as one, so its weight reads (n, k) and the tp
# search can split it like any nn.Linear (the transpose, left unused, is pruned)
TRANSPOSE_OPS = {"t", "numpy_T", "transpose", "permute", "swapaxes", "swapdims"}
SKIP_OPS = {"_assert_tensor_metadata", "_assert_async", "_assert_scalar", "sym_constrain_range_for_size",
            "_set_grad_enabled", "_enter_autocast", "_exit_autocast"}


def dtype_str(dt) -> str:
    return str(dt).replace("torch.", "")


def _is_tensor(v):
    return isinstance(v, torch.Tensor)


def op_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        name = target.overloadpacket.__name__
    elif isinstance(target, torch._ops.OpOverloadPacket):
        name = target.__name__
    else:
        name = getattr(target, "__name__", str(target))
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]                         # in-place variant: same op for our purposes
    return name


def module_of(fx_node, strip: str) -> tuple:
    """(innermost module qualname, [all enclosing module qualnames, outermost first])."""
    stack = fx_node.meta.get("nn_module_stack") or {}
    paths = []
    for v in stack.values():
        path = v[0] if isinstance(v, tuple) else str(v)
        path = _strip(path, strip)
        if path is not None:
            paths.append(path)
    return (paths[-1] if paths else ""), paths


def _strip(path, strip):
    if not strip:
        return path
    if path == strip[:-1]:
        return ""
    if path.startswith(strip):
        return path[len(strip):]
    return "" if path == "" else path


class ParamArg:
    """A parameter/buffer passed to an op by qualname (the fx fallback's leaf modules)."""

    def __init__(self, qualname, tensor):
        self.qualname, self.tensor = qualname, tensor


class Converter:
    def __init__(self, batch: int, strip: str = ""):
        self.batch = batch
        self.strip = strip
        self.nodes = {}          # name -> OpNode
        self.batch_axes = {}     # name -> tuple[bool] per out axis
        self.ref = {}            # fx name -> ("node", name) | ("param", qualname) | ("const",) | ("split", ...)
        self.scopes = {}         # node name -> enclosing module qualnames (outermost first)
        self.outputs = ()

    # ---- inputs -------------------------------------------------------------------------------
    def placeholder(self, n, kind, qualname):
        val = n.meta.get("val")
        if kind in ("param", "buffer"):
            self.ref[n.name] = ("param", _strip(qualname, self.strip))
            return
        if not _is_tensor(val):
            self.ref[n.name] = ("const",)
            return
        shape = tuple(int(s) for s in val.shape)
        # Axis 0 of a user input is the data batch when it has the batch size.
        batch0 = len(shape) > 0 and shape[0] == self.batch
        dims = tuple(Dim(f"a{i}", s, True, batch0 and i == 0) for i, s in enumerate(shape))
        out = TensorSpec(shape, dtype_str(val.dtype), tuple(d.name for d in dims))
        self.nodes[n.name] = OpNode(n.name, "input", "input", dims, (), out, 0.0, 0.0, (), "", None,
                                    {"input": qualname})
        self.batch_axes[n.name] = tuple(d.batch for d in dims)
        self.ref[n.name] = ("node", n.name)
        self.scopes[n.name] = []

    # ---- calls --------------------------------------------------------------------------------
    def call(self, n):
        val = n.meta.get("val")
        if n.target is operator.getitem:
            return self._getitem(n, val)
        name = op_name(n.target)
        if name in INLINE_HOPS:
            return self._inline(n, name)
        if name in SKIP_OPS or val is None:
            self.ref[n.name] = ("const",)
            return
        if isinstance(val, (tuple, list)):
            if name in SPLIT_OPS:
                src = n.args[0]
                dim = n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)
                if name == "unbind":
                    dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
                self.ref[n.name] = ("split", src, int(dim), name, str(n.target))
                return
            first = next((v for v in val if _is_tensor(v)), None)
            if first is None:
                self.ref[n.name] = ("const",)
                return
            self._make(n, name, str(n.target), n.args, n.kwargs, first)
            self.ref[n.name] = ("multi", n.name)
            return
        if not _is_tensor(val):
            self.ref[n.name] = ("const",)
            return
        if name in ALIAS_OPS and self._alias(n, val):
            return
        if name in ("matmul", "mm") and len(n.args) == 2 and not n.kwargs:
            w = self._transposed_param(n.args[1])
            if w is not None:
                return self._make(n, "linear", str(n.target), (n.args[0], w), {}, val)
        self._make(n, name, str(n.target), n.args, n.kwargs, val)

    def _transposed_param(self, a):
        """The fx node of the 2-D parameter that `a` transposes (W.T, W.t(), W.transpose(0, 1)), or None."""
        if not isinstance(a, torch.fx.Node) or a.op != "call_function" or op_name(a.target) not in TRANSPOSE_OPS:
            return None
        src = a.args[0] if a.args else None
        v = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        if not _is_tensor(v) or v.dim() != 2 or self.ref.get(src.name, ("",))[0] != "param":
            return None
        rest = [int(x) % 2 for x in (a.args[1:] if op_name(a.target) not in ("permute",) else a.args[1])]
        swaps = op_name(a.target) in ("t", "numpy_T") or (op_name(a.target) == "permute" and rest == [1, 0]) \
            or (op_name(a.target) != "permute" and len(rest) == 2 and rest[0] != rest[1])
        return src if swaps else None

    def _alias(self, n, val) -> bool:
        """`x.to(dtype)` / `type_as` / `alias` / `detach` that change nothing return x itself: no op
        runs, so the result is x's node rather than a node of its own (HF models cast the residual
        stream to float32 in every norm; it already is)."""
        src = n.args[0] if n.args else None
        if not isinstance(src, torch.fx.Node) or not _is_tensor(src.meta.get("val")):
            return False
        sv = src.meta["val"]
        if sv.dtype != val.dtype or tuple(sv.shape) != tuple(val.shape) or sv.device != val.device:
            return False
        r = self.ref.get(src.name, ("const",))
        if r[0] == "multi":
            r = ("node", r[1])
        if r[0] != "node":
            return False
        self.ref[n.name] = r
        return True

    def _inline(self, n, name):
        """A higher-order op that only wraps a subgraph in a mode (grad enabled/disabled, autocast):
        convert the subgraph's calls in place, as if they had been traced inline.  Inner nodes get
        fresh names that canonical_names turns into fx-style ones."""
        at = INLINE_HOPS[name]
        sub_node, args = n.args[at], n.args[at + 1:]
        gm = getattr(sub_node.graph.owning_module, str(sub_node.target), None)
        if gm is None or not hasattr(gm, "graph"):
            raise TypeError(f"{name}: subgraph {sub_node.target!r} not found")
        outer_scope = n.meta.get("nn_module_stack")
        phs = [x for x in gm.graph.nodes if x.op == "placeholder"]
        for ph, a in zip(phs, args):
            ph.name = self._fresh(ph.name)
            self.ref[ph.name] = self.ref.get(a.name, ("const",)) if isinstance(a, torch.fx.Node) else ("const",)
        for x in gm.graph.nodes:
            if x.op == "placeholder":
                continue
            x.name = self._fresh(x.name)
            if outer_scope and not x.meta.get("nn_module_stack"):
                x.meta["nn_module_stack"] = outer_scope
            if x.op == "call_function":
                self.call(x)
            elif x.op == "output":
                outs = x.args[0] if isinstance(x.args[0], (tuple, list)) else (x.args[0],)
                refs = tuple(self.ref.get(o.name, ("const",)) if isinstance(o, torch.fx.Node) else ("const",)
                             for o in outs)
                self.ref[n.name] = ("tuple", refs)

    def _fresh(self, name):
        self._inlined = getattr(self, "_inlined", 0) + 1
        return f"{name}__rep{100000 + self._inlined}"

    def _getitem(self, n, val):
        src, idx = n.args
        r = self.ref.get(src.name, ("const",))
        if r[0] == "multi":
            # further outputs of the same shape (topk / sort / max.dim indices) share the node: the
            # same iteration space and layout; others (a norm's saved statistics) carry nothing
            same = idx == 0 or (_is_tensor(val) and r[1] in self.nodes
                                and tuple(int(x) for x in val.shape) == self.nodes[r[1]].out.shape)
            self.ref[n.name] = ("node", r[1]) if same else ("const",)
        elif r[0] == "tuple":
            self.ref[n.name] = r[1][idx] if idx < len(r[1]) else ("const",)
        elif r[0] == "split" and _is_tensor(val):
            _, x, dim, op, target = r
            if op == "unbind":
                self._make(n, "select", f"{target}[{idx}]", (x, dim, idx), {}, val)
            else:
                # the piece's place among its siblings: a fused q/k/v projection split by heads
                # (search/tp_layout.py) needs every piece's size along the cut axis
                vals = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
                sizes = ([int(v.shape[dim]) for v in vals] if isinstance(vals, (list, tuple))
                         and all(_is_tensor(v) and v.dim() > dim for v in vals) else None)
                kw = {"piece": (idx, tuple(sizes))} if sizes and 0 <= idx < len(sizes) else {}
                self._make(n, "slice", f"{target}[{idx}]", (x, dim), kw, val)
        else:
            self.ref[n.name] = ("const",)

    def _make(self, n, op, target, args, kwargs, val):
        ins, operands, in_batch = [], [], []

        def sub(a):
            if isinstance(a, ParamArg):
                shape, dt = tuple(int(x) for x in a.tensor.shape), dtype_str(a.tensor.dtype)
                ins.append(Tin(shape, dt, is_param=True))
                operands.append((shape, dt, None, _strip(a.qualname, self.strip)))
                in_batch.append((False,) * len(shape))
                return TRef(len(ins) - 1)
            if isinstance(a, torch.fx.Node):
                v = a.meta.get("val")
                if not _is_tensor(v):
                    return int(v) if isinstance(v, (int, torch.SymInt)) else v
                shape, dt = tuple(int(s) for s in v.shape), dtype_str(v.dtype)
                r = self.ref.get(a.name, ("const",))
                if r[0] == "multi":
                    r = ("node", r[1])
                if r[0] == "param":
                    ins.append(Tin(shape, dt, is_param=True))
                    operands.append((shape, dt, None, r[1]))
                    in_batch.append((False,) * len(shape))
                elif r[0] == "node" and r[1] in self.nodes:
                    pb = self.batch_axes[r[1]]
                    pb = pb if len(pb) == len(shape) else (False,) * len(shape)
                    ins.append(Tin(shape, dt, is_act=True, batch=pb))
                    operands.append((shape, dt, r[1], None))
                    in_batch.append(pb)
                else:
                    ins.append(Tin(shape, dt))
                    operands.append((shape, dt, None, None))
                    in_batch.append((False,) * len(shape))
                return TRef(len(ins) - 1)
            if isinstance(a, (list, tuple)):
                return type(a)(sub(x) for x in a)
            return a

        cargs = tuple(sub(a) for a in args)
        ckwargs = {k: sub(v) for k, v in kwargs.items()}
        out_shape = tuple(int(s) for s in val.shape)
        call = OpCall(op, ins, cargs, ckwargs, out_shape, dtype_str(val.dtype))
        spec = spec_for(call)
        in_dims = _sanitize(spec, ins, out_shape)
        is_batch = {d[0]: False for d in spec.dims}
        for i, dd in enumerate(in_dims):
            for ax, dn in enumerate(dd):
                if dn is not None and in_batch[i][ax]:
                    is_batch[dn] = True
        for i, ax, dn in spec.also:
            if dn in is_batch and i < len(in_batch) and ax < len(in_batch[i]) and in_batch[i][ax]:
                is_batch[dn] = True
        local = set(spec.local)
        dims = tuple(Dim(nm, sz, (is_batch[nm] if (spec.generic or nm in local) else sp), is_batch[nm])
                     for nm, sz, sp in spec.dims)
        ops = tuple(Operand(s, dt, dd, p, q) for (s, dt, p, q), dd in zip(operands, in_dims))
        out = TensorSpec(out_shape, call.out_dtype, spec.out_dims)
        if op == "embedding":
            nbytes = ops[1].nbytes + 2 * out.nbytes
        elif spec.copies:
            nbytes = sum(o.nbytes for o in ops) + out.nbytes
        else:
            nbytes = 0.0
        module, scopes = module_of(n, self.strip)
        if n.op == "call_module":          # fx fallback: the leaf module is the node itself
            leaf = _strip(str(n.target), self.strip)
            module, scopes = leaf, scopes + [leaf]
        extra = dict(spec.extra)
        if spec.generic:
            extra["generic"] = True
        self.nodes[n.name] = OpNode(n.name, spec.kind, target, dims, ops, out, float(spec.flops),
                                    float(nbytes), tuple(spec.saves), module, None, extra)
        self.batch_axes[n.name] = tuple(dn is not None and is_batch.get(dn, False) for dn in spec.out_dims)
        self.ref[n.name] = ("node", n.name)
        self.scopes[n.name] = scopes

    def output(self, n):
        names = []

        def walk(a):
            if isinstance(a, torch.fx.Node):
                r = self.ref.get(a.name, ("const",))
                if r[0] in ("node", "multi") and r[1] in self.nodes and r[1] not in names:
                    names.append(r[1])
            elif isinstance(a, (list, tuple)):
                for x in a:
                    walk(x)
            elif isinstance(a, dict):
                for x in a.values():
                    walk(x)
        walk(n.args)
        self.outputs = tuple(names)


def _sanitize(spec, ins, out_shape):
    """Keep a handler's mapping only where sizes agree (a wrong link would mis-shard silently)."""
    sizes = {d[0]: d[1] for d in spec.dims}
    res = []
    for i, t in enumerate(ins):
        dd = spec.in_dims[i] if i < len(spec.in_dims) else ()
        if len(dd) != len(t.shape):
            dd = (None,) * len(t.shape)
        if spec.trusted:
            res.append(tuple(dn if dn in sizes else None for dn in dd))
            continue
        res.append(tuple(dn if (dn in sizes and sizes[dn] == t.shape[ax]) else None for ax, dn in enumerate(dd)))
    return res


def prune(nodes, outputs):
    """Drop nodes no output depends on (buffer bookkeeping such as BatchNorm's step counter)."""
    live, stack = set(), list(outputs)
    while stack:
        x = stack.pop()
        if x in live or x not in nodes:
            continue
        live.add(x)
        stack.extend(nodes[x].producers)
    return {k: v for k, v in nodes.items() if k in live}


_SUFFIX = re.compile(r"_\d+$")
_REP = re.compile(r"__rep\d+$")


def canonical_names(nodes, outputs, keep=()):
    """Rename nodes fx-style (base, base_1, base_2, ...) in order, so a graph assembled from pieces
    names its nodes exactly as a direct capture would.  Names in `keep` (inputs) are kept."""
    taken = set(keep)
    counters, mapping = {}, {}
    for name, node in nodes.items():
        if name in keep:
            mapping[name] = name
            continue
        base = _SUFFIX.sub("", _REP.sub("", name))
        while True:
            k = counters.get(base, 0)
            counters[base] = k + 1
            new = base if k == 0 else f"{base}_{k}"
            if new not in taken:
                break
        taken.add(new)
        mapping[name] = new
    out = {}
    for name, n in nodes.items():
        ops = tuple(Operand(o.shape, o.dtype, o.dims, mapping.get(o.producer) if o.producer else None, o.param)
                    for o in n.operands)
        out[mapping[name]] = OpNode(mapping[name], n.kind, n.target, n.dims, ops, n.out, n.flops, n.bytes,
                                    n.saves, n.module, n.block, n.extra)
    return out, tuple(mapping[o] for o in outputs), mapping


def param_infos(root, strip, entries):
    """ParamInfo per lifted parameter/buffer (buffers are not trainable).  Buffers are marked with
    a temporary name prefix so unused ones can be dropped."""
    out = {}
    for q, is_buffer in entries:
        qs = q[len(strip):] if strip and q.startswith(strip) else q
        mod_q, _, leaf = q.rpartition(".")
        mod = root.get_submodule(mod_q) if mod_q else root
        t = getattr(mod, leaf)
        sparse = isinstance(mod, torch.nn.Embedding) and bool(mod.sparse) and leaf == "weight"
        module = qs.rpartition(".")[0]
        out[qs] = ParamInfo(("__buffer__" if is_buffer else "") + qs, tuple(int(s) for s in t.shape),
                            dtype_str(t.dtype), module,
                            (not is_buffer) and bool(getattr(t, "requires_grad", False)), sparse)
    return out
