"""Fallback capture when torch.export fails: torch.fx.symbolic_trace + ShapeProp (fake tensors),
then the torch-level calls (leaf nn modules, torch/F functions, tensor methods) are translated to
the ATen-style calls sapp.capture.ops understands and fed to the same Converter."""
from __future__ import annotations

import operator

import torch
from torch import nn

from sapp.capture.ir import OpGraph
from .blocks import assign_blocks, container_children, group_blocks
from .convert import Converter, ParamArg, canonical_names, prune
from .fuse import fuse_rms_norms

_ACT = {nn.ReLU: "relu", nn.GELU: "gelu", nn.SiLU: "silu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid",
        nn.LeakyReLU: "leaky_relu", nn.ELU: "elu", nn.Softplus: "softplus", nn.Hardtanh: "hardtanh",
        nn.Mish: "mish", nn.Hardswish: "hardswish"}
_FN = {"iadd": "add", "truediv": "div", "itruediv": "div", "imul": "mul", "isub": "sub",
       "floordiv": "floor_divide", "cross_entropy": "cross_entropy_loss", "concat": "cat",
       "float": "to", "half": "to", "bfloat16": "to", "type": "to", "double": "to"}


def capture_fx(root, inputs, kwargs, strip, batch, gname, model):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.shape_prop import ShapeProp

    gm = torch.fx.symbolic_trace(root) if not kwargs else _trace_kwargs(root, kwargs, len(inputs))
    args = tuple(inputs) + tuple(kwargs.values())
    n_ph = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    if n_ph != len(args):
        raise TypeError(f"forward takes {n_ph} positional arguments but {len(args)} were given")
    ShapeProp(gm, fake_mode=FakeTensorMode(allow_non_fake_inputs=True)).propagate(*args)
    for n in gm.graph.nodes:
        tm = n.meta.get("tensor_meta")
        n.meta["val"] = _meta_val(tm)
    conv = Converter(batch, strip)
    params = dict(root.named_parameters(remove_duplicate=False))
    buffers = dict(root.named_buffers(remove_duplicate=False))
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            conv.placeholder(n, "input", n.name)
        elif n.op == "get_attr":
            q = str(n.target)
            if q in params or q in buffers:
                conv.ref[n.name] = ("param", q[len(strip):] if strip and q.startswith(strip) else q)
            else:
                conv.ref[n.name] = ("const",)
        elif n.op in ("call_function", "call_method", "call_module"):
            _call(conv, n, root, gm)
        elif n.op == "output":
            conv.output(n)
    nodes = prune(fuse_rms_norms(conv.nodes, conv.outputs), conv.outputs)
    blocks = assign_blocks(nodes, conv.scopes, container_children(root, strip))
    ins = [k for k, v in nodes.items() if v.kind == "input"]
    nodes, outputs, mapping = canonical_names(nodes, conv.outputs, keep=ins)
    blocks = {b: [mapping[x] for x in v] for b, v in blocks.items()}
    from .convert import param_infos
    used = {p for nd in nodes.values() for p in nd.params}
    entries = [(q, False) for q in params] + [(q, True) for q in buffers]
    pinfo = {q: p for q, p in param_infos(root, strip, entries).items()
             if not p.name.startswith("__buffer__") or q in used}
    from sapp.capture.ir import ParamInfo
    pinfo = {q: ParamInfo(q, p.shape, p.dtype, p.module, p.trainable, p.sparse_grad) for q, p in pinfo.items()}
    return OpGraph(gname, nodes, pinfo, outputs, batch, blocks, group_blocks(nodes, blocks), {"_path": "fx"})


class _Loss1(nn.Module):
    """WithLoss with a fixed arity (fx reads the arity from forward's code object)."""

    def __init__(self, wl):
        super().__init__()
        self.model, self.loss_fn = wl.model, wl.loss_fn

    def forward(self, x0, target):
        return self.loss_fn(self.model(x0), target)


class _Loss2(_Loss1):
    def forward(self, x0, x1, target):
        return self.loss_fn(self.model(x0, x1), target)


class _Loss3(_Loss1):
    def forward(self, x0, x1, x2, target):
        return self.loss_fn(self.model(x0, x1, x2), target)


def _trace_kwargs(root, kwargs, n_inputs):
    if list(kwargs) != ["target"] or not 1 <= n_inputs <= 3:
        raise NotImplementedError("fx fallback: keyword inputs other than a loss target")
    return torch.fx.symbolic_trace((_Loss1, _Loss2, _Loss3)[n_inputs - 1](root))


def _meta_val(tm):
    if tm is None:
        return None
    if hasattr(tm, "shape") and hasattr(tm, "dtype"):
        return torch.empty(tuple(tm.shape), dtype=tm.dtype, device="meta")
    if isinstance(tm, (list, tuple)):
        return type(tm)(_meta_val(t) for t in tm)
    return None


def _call(conv, n, root, gm):
    val = n.meta.get("val")
    if n.op == "call_module":
        m = gm.get_submodule(str(n.target))
        op, args, kw = _module_call(m, str(n.target), n)
    else:
        fn = n.target
        name = fn if isinstance(fn, str) else getattr(fn, "__name__", str(fn))
        if fn is operator.getitem:
            src = n.args[0]
            if isinstance(src, torch.fx.Node) and isinstance(src.meta.get("val"), torch.Tensor):
                op, args, kw = "index", (src,), {}          # tensor indexing: shape known, generic
            else:
                return conv.call(n)
        else:
            op, args, kw = _FN.get(name, name), tuple(n.args), dict(n.kwargs)
            if op == "embedding" and n.op == "call_function":   # F.embedding(input, weight)
                args = (args[1], args[0]) + args[2:]
    if val is None or not isinstance(val, (torch.Tensor, tuple, list)):
        conv.ref[n.name] = ("const",)
        return
    if isinstance(val, (tuple, list)):
        from .convert import SPLIT_OPS
        if op in SPLIT_OPS:
            dim = kw.get("dim", args[2] if len(args) > 2 else 0)
            if op == "unbind":
                dim = kw.get("dim", args[1] if len(args) > 1 else 0)
            conv.ref[n.name] = ("split", args[0], int(dim), op, f"torch.{op}")
            return
        first = next((v for v in val if isinstance(v, torch.Tensor)), None)
        if first is None:
            conv.ref[n.name] = ("const",)
            return
        conv._make(n, op, f"torch.{op}", args, kw, first)
        conv.ref[n.name] = ("multi", n.name)
        return
    if n.op == "call_module":
        target = f"nn.{type(gm.get_submodule(str(n.target))).__name__}"
    else:
        target = f"torch.{op}"
    conv._make(n, op, target, args, kw, val)


def _module_call(m, q, n):
    x = n.args[0] if n.args else None

    def P(leaf):
        t = getattr(m, leaf, None)
        return ParamArg(f"{q}.{leaf}", t) if isinstance(t, torch.Tensor) else None
    if isinstance(m, nn.Linear):
        return "linear", (x, P("weight"), P("bias")), {}
    if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return "conv2d", (x, P("weight"), P("bias"), m.stride, m.padding, m.dilation, m.groups), {}
    if isinstance(m, nn.Embedding):
        return "embedding", (P("weight"), x, m.padding_idx or -1, False, m.sparse), {}
    if isinstance(m, nn.LayerNorm):
        return "layer_norm", (x, list(m.normalized_shape), P("weight"), P("bias"), m.eps), {}
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return "batch_norm", (x, P("weight"), P("bias"), P("running_mean"), P("running_var"),
                              m.training or m.running_mean is None), {}
    if isinstance(m, nn.GroupNorm):
        return "group_norm", (x, m.num_groups, P("weight"), P("bias")), {}
    if isinstance(m, nn.modules.dropout._DropoutNd):
        return "dropout", (x, m.p, m.training), {}
    if type(m) in _ACT:
        return _ACT[type(m)], (x,), {}
    if isinstance(m, (nn.Softmax, nn.LogSoftmax)):
        return ("softmax" if isinstance(m, nn.Softmax) else "log_softmax"), (x, m.dim if m.dim is not None else -1), {}
    if isinstance(m, (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)):
        return "max_pool2d", (x, m.kernel_size), {}
    if isinstance(m, (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
                      nn.AdaptiveAvgPool3d)):
        return "adaptive_avg_pool2d", (x,), {}
    if isinstance(m, nn.Flatten):
        return "flatten", (x,), {}
    if isinstance(m, nn.Identity):
        return "alias", (x,), {}
    if isinstance(m, nn.CrossEntropyLoss):
        return "cross_entropy_loss", tuple(n.args), {}
    if isinstance(m, nn.BCEWithLogitsLoss):
        return "binary_cross_entropy_with_logits", tuple(n.args), {}
    if isinstance(m, nn.MSELoss):
        return "mse_loss", tuple(n.args), {}
    # Unknown leaf module: a generic op over its inputs and its own parameters.
    extra = tuple(ParamArg(f"{q}.{k}", t) for k, t in m.named_parameters(recurse=False))
    return type(m).__name__, tuple(n.args) + extra, dict(n.kwargs)
