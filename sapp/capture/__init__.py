"""Model -> OpGraph.

    graph = sapp.capture.capture(sapp.models.get("gpt3-175b"), batch=8)
    graph = sapp.capture.capture(my_module, (x,), target=y, loss_fn=F.cross_entropy)

torch.export.export(strict=False) traces the module (parameters stay fake/meta: nothing is
computed or allocated) into an ATen graph; each call becomes an OpNode (sapp/capture/ops.py).  Zoo
models are captured together with their loss (sapp.models.WithLoss).  A deep stack of identical
blocks in an nn.ModuleList is captured with three blocks and replicated to the full depth (exactly
equal to a direct capture, checked by tests/test_capture_expand.py) - 96-layer GPT-3 in well under
a second instead of several; blocks of another kind before the run (DeepSeek-V3's first 3 dense
blocks before 58 MoE ones) are captured as they are.  When export fails, a torch.fx symbolic trace is tried; when both fail
a CaptureError names the module that broke and what to try.  Before that, export is retried for the
classes sapp/capture/retry.py names (a cpu tensor meeting meta ones, Hugging Face's compile-only
branches, a Python branch on a tensor's value taken as the real example's values take it)."""
from __future__ import annotations

from ..errors import CaptureError
from sapp.capture.ir import OpGraph, ParamInfo
# blocks / convert import torch: they load when a capture runs, so `sapp.capture.cache` and
# `sapp.capture.unknown` (a warm cached search) stay torch-free

__all__ = ["capture"]

DEFAULT_BATCH = 8
FAST_MIN_DEPTH = 5       # replicate blocks for stacks deeper than this (shallow ones export fast)
FAST_KEEP = 3            # blocks captured before replicating (3 tell chain inputs from others)


def capture(model, example_inputs=None, *, target=None, loss_fn=None, batch=None, name=None,
            fast=None, method="auto") -> OpGraph:
    """Trace `model` into an OpGraph.  Zoo models need nothing else (inputs, targets and loss come
    from sapp.models at `batch`, default 8).  Other modules need `example_inputs` (a tensor or a tuple
    matching forward); give `target` and `loss_fn(output, target)` to include the loss.
    fast=None replicates a deep stack of identical blocks (True forces, False disables).
    method="auto" uses torch.export and falls back to torch.fx; "fx" forces the fallback."""
    if method not in ("auto", "export", "fx"):
        raise CaptureError(f"unknown capture method {method!r}: use auto, export or fx")
    import importlib

    import torch
    # importlib, not `from .. import models`: sapp.__getattr__ would recurse on the latter.
    zoo = importlib.import_module("sapp.models")

    spec = getattr(model, "sapp_spec", None)
    if isinstance(model, zoo.WithLoss):
        loss_fn = loss_fn or model.loss_fn
        model = model.model
        spec = spec or getattr(model, "sapp_spec", None)
    device = _device(model)
    if example_inputs is None:
        if spec is None:
            raise CaptureError(f"cannot capture {type(model).__name__} without inputs: pass "
                               "example_inputs matching forward(...)")
        batch = batch or DEFAULT_BATCH
        example_inputs = zoo.example_inputs(model, batch, device)
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    given = tuple(example_inputs)           # their values, for a meta model's branch on them (retry.py)
    example_inputs = tuple(_to(x, device) for x in example_inputs)
    first = next((x for x in example_inputs if isinstance(x, torch.Tensor) and x.dim() > 0), None)
    batch = batch or (int(first.shape[0]) if first is not None else 1)
    data = getattr(model, "sapp_data", None)          # a factory's or HF config's example data
    if spec is not None and (data is None or data.loss_fn is not None or loss_fn is not None):
        loss_fn = loss_fn or zoo.loss_fn(model)
        if target is None:
            target = zoo.example_targets(model, batch, device)
    if batch == 1 and first is not None and first.shape[0] == 1:
        # A size-1 batch axis is indistinguishable from any other size-1 axis once views merge
        # it, so capture at batch 2 and scale the graph down.
        return _at_batch_one(model, example_inputs, target, loss_fn, name, fast, method)
    with_loss = loss_fn is not None and target is not None
    root = zoo.WithLoss(model, loss_fn) if with_loss else model
    kwargs = {"target": _to(target, device)} if with_loss else {}
    strip = "model." if with_loss else ""
    gname = name or (spec.name if spec else type(model).__name__)

    modes = {m: m.training for m in root.modules()}
    root.train()                  # capture what training runs: dropout, batch statistics
    # an HF decoder's attention masks as its eager forward decides them, not as export forces them
    from ..models.hf import eager_masks
    from .devices import meta_as_training_device
    from .retry import example_values
    from .state import kept
    try:
        with kept(root), eager_masks(model, example_inputs, kwargs), meta_as_training_device(), \
                example_values(given, {"target": target} if with_loss else {}):
            return _capture_traced(root, model, spec, example_inputs, kwargs, strip, batch, gname, fast, method)
    except CaptureError:
        raise
    except Exception as e:            # noqa: BLE001 - never a traceback: one line naming where it broke
        short = " ".join(str(e).split())[:160]
        raise CaptureError(f"cannot capture {type(root).__name__}{_op_at(e)}: {type(e).__name__}: {short}; sapp's "
                           "capture does not handle this model yet: report it with this line") from None
    finally:
        for m, t in modes.items():      # parents first: train() recurses, so call it only where a mode differs
            if m.training != t:
                m.train(t)


def _capture_traced(root, model, spec, example_inputs, kwargs, strip, batch, gname, fast, method):
    from .blocks import repeated_list
    stack = repeated_list(model) if fast is not False and method != "fx" else None
    run = stack[3] - stack[4] if stack is not None else 0       # identical blocks at the list's end
    if run > FAST_KEEP and (fast or run > FAST_MIN_DEPTH):
        graph = _capture_fast(root, model, stack, example_inputs, kwargs, strip, batch, gname)
        if graph is not None:
            graph.meta.pop("_path", None)
            return _finish(graph, model, spec, batch, example_inputs, "export+replicate")
    graph = _capture_once(root, example_inputs, kwargs, strip, batch, gname, model, method=method)
    return _finish(graph, model, spec, batch, example_inputs, graph.meta.pop("_path"))


def _at_batch_one(model, inputs, target, loss_fn, name, fast, method):
    import torch

    def double(x):
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == 1:
            return torch.cat([x, x])
        return x
    g = capture(model, tuple(double(x) for x in inputs), target=double(target), loss_fn=loss_fn, batch=2,
                name=name, fast=fast, method=method).rebatch(1)
    for n in g.nodes.values():
        if n.kind == "embedding":      # bytes are ids + rows read + written: all per-sample
            n.bytes = float(n.operands[1].nbytes + 2 * n.out.nbytes)
    g.meta["batch"] = 1
    return g


def _device(model):
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return None


def _to(x, device):
    import torch
    if device is not None and isinstance(x, torch.Tensor) and x.device != device:
        return x.to(device) if device.type != "meta" else torch.empty_like(x, device="meta")
    return x


def _capture_fast(root, model, stack, inputs, kwargs, strip, batch, gname):
    from torch import nn
    qn, parent, attr, depth, start = stack
    full = parent._modules[attr]
    kept = start + FAST_KEEP              # the differing blocks before the run, then three of the run
    parent._modules[attr] = nn.ModuleList(list(full)[:kept])
    try:
        graph = _capture_once(root, inputs, kwargs, strip, batch, gname, model, expand=(qn, depth, kept))
    except CaptureError:
        graph = None
    finally:
        parent._modules[attr] = full
    return graph


def _capture_once(root, inputs, kwargs, strip, batch, gname, model, expand=None, method="auto"):
    import torch

    from .retry import export
    err, where, ours = None, None, False
    with _ModuleTracker(root, strip) as tracker:
        try:
            if method == "fx":
                raise _SkipExport()
            ep = export(root, inputs, kwargs)
        except _SkipExport:
            ep = None
        except Exception as e:        # noqa: BLE001 - any tracing failure goes to the fallback
            ep, err, where = None, e, tracker.failed_at()
    if ep is not None:
        try:
            return _from_export(_lower_transforms(ep), root, strip, batch, gname, model, expand)
        except CaptureError:
            raise
        except Exception as e:        # noqa: BLE001 - torch traced the model; sapp could not read the graph
            err, ours = e, True
    if expand is not None or method == "export":
        raise CaptureError(_explain(err, where, root, ours))
    from .fxpath import capture_fx
    try:
        return capture_fx(root, inputs, kwargs, strip, batch, gname, model)
    except Exception as e:            # noqa: BLE001 - report the export error, the clearer one
        if err is None:
            err, where = e, None
    raise CaptureError(_explain(err, where, root, ours))


def _lower_transforms(ep):
    """torch.export keeps a functorch transform (`torch.vmap`: T5Gemma2's mask functions) as calls
    into torch._functorch.predispatch (_add_batch_dim ... _remove_batch_dim) around per-sample ops,
    which price one sample of the vmapped batch.  Lowering the program to ATen
    (run_decompositions with an empty table) batches those ops for real and leaves every other op
    (linear, sdpa, layer_norm) as it is; only programs holding such calls are lowered."""
    if not any(getattr(n.target, "__module__", "") == "torch._functorch.predispatch" for n in ep.graph.nodes):
        return ep
    return ep.run_decompositions({})


class _SkipExport(Exception):
    pass


def _from_export(ep, root, strip, batch, gname, model, expand):
    from torch.export.graph_signature import InputKind

    from .blocks import assign_blocks, container_children, expand_blocks, group_blocks
    from .convert import Converter, canonical_names, param_infos, prune
    from .fuse import fuse_rms_norms
    conv = Converter(batch, strip)
    kinds = {}
    firsts = {}
    for name, m in root.named_modules():
        firsts.setdefault(id(m), name)
    for s in ep.graph_signature.input_specs:
        if s.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            kinds[s.arg.name] = ("param" if s.kind == InputKind.PARAMETER else "buffer",
                                 _first_path(root, s.target, firsts))
        elif s.kind == InputKind.USER_INPUT:
            kinds[s.arg.name] = ("input", s.arg.name)
        else:
            kinds[getattr(s.arg, "name", "")] = ("const", None)
    kinds, tied = _untie(ep, root, kinds)
    for n in ep.graph.nodes:
        if n.op == "placeholder":
            k, q = kinds.get(n.name, ("const", None))
            if k == "const":
                conv.ref[n.name] = ("const",)
            else:
                conv.placeholder(n, k, q)
        elif n.op == "call_function":
            conv.call(n)
        elif n.op == "output":
            conv.output(n)
    nodes = prune(fuse_rms_norms(conv.nodes, conv.outputs), conv.outputs)
    blocks = assign_blocks(nodes, conv.scopes, container_children(root, strip))
    outputs = conv.outputs
    params = param_infos(root, strip, list(dict.fromkeys((q, k == "buffer") for k, q in kinds.values()
                                                    if k in ("param", "buffer"))))
    if expand is not None:
        lq, depth, kept = expand
        res = expand_blocks(nodes, outputs, blocks, lq, depth, kept)
        if res is None:
            raise CaptureError("blocks not replicable")
        nodes, outputs, blocks = res
        params = _replicate_params(params, lq, depth, kept)
    inputs = [n for n, v in nodes.items() if v.kind == "input"]
    nodes, outputs, mapping = canonical_names(nodes, outputs, keep=inputs)
    blocks = {b: [mapping[x] for x in v] for b, v in blocks.items()}
    used = {p for n in nodes.values() for p in n.params}
    params = {q: p for q, p in params.items() if not p.name.startswith("__buffer__") or q in used}
    params = {q: ParamInfo(q, p.shape, p.dtype, p.module, p.trainable, p.sparse_grad)
              for q, p in params.items()}
    meta = {"_path": "export"}
    from .batchy import batch_stat_modules, written_from_batch
    written = written_from_batch(ep, strip, set(batch_stat_modules(root)))
    if expand is not None:      # the blocks past the captured ones write what the template block writes
        pre = f"{lq}.{kept - 1}."
        written = sorted(set(written) | {f"{lq}.{k}.{q[len(pre):]}" for q in written if q.startswith(pre)
                                         for k in range(kept, depth)})
    if written:
        meta["batch_buffers"] = written
    if tied:
        def st(q):
            return q[len(strip):] if strip and q.startswith(strip) else q
        meta["tied"] = {st(a): st(tied[a]) for a in sorted(tied)}
    return OpGraph(gname, nodes, params, outputs, batch, blocks, group_blocks(nodes, blocks), meta)


def _first_path(root, q: str, firsts: dict) -> str:
    """`q` by the first path of the module holding it: one module registered under two paths
    (performer-pytorch keeps its layers under `net` and `proj_updater.instance`) is named everywhere by
    the path named_modules gives first, which export may not pick.  A weight two modules share (a tied
    table) keeps its name (`_untie`)."""
    mod_q, _, leaf = q.rpartition(".")
    try:
        mod = root.get_submodule(mod_q) if mod_q else root
    except AttributeError:
        return q
    name = firsts.get(id(mod), mod_q)
    return f"{name}.{leaf}" if name else leaf


def _untie(ep, root, kinds):
    """Tied weights (one tensor under several qualnames, e.g. GPT-2's wte/lm_head) become one
    parameter: every placeholder of that tensor maps to the qualname the graph uses.  Returns the
    new kinds and {other qualname (unstripped): kept qualname}."""
    used = {n.name for n in ep.graph.nodes if n.op == "placeholder" and n.users}
    by_tensor = {}
    for ph, (k, q) in kinds.items():
        if k in ("param", "buffer"):
            try:
                t = root.get_parameter(q) if k == "param" else root.get_buffer(q)
            except AttributeError:
                continue
            by_tensor.setdefault(id(t), []).append(ph)
    out, tied = dict(kinds), {}
    for phs in by_tensor.values():
        if len(phs) < 2:
            continue
        keep = next((p for p in phs if p in used), phs[0])
        for p in phs:
            if p != keep:
                tied[kinds[p][1]] = kinds[keep][1]
                out[p] = kinds[keep]
    return out, tied


def _replicate_params(params, lq, depth, kept):
    """Add lq.k.* copies (k >= kept) of every lq.<kept-1>.* entry, placed where a direct capture
    lists them: after each contiguous run of template names (parameters and buffers form separate
    runs)."""
    pre = f"{lq}.{kept - 1}."
    items = list(params.items())
    out, run = {}, []

    def flush():
        for k in range(kept, depth):
            for q, p in run:
                nq = f"{lq}.{k}." + q[len(pre):]
                nm = ("__buffer__" if p.name.startswith("__buffer__") else "") + nq
                out[nq] = ParamInfo(nm, p.shape, p.dtype, nq.rpartition(".")[0], p.trainable, p.sparse_grad)
        run.clear()

    for q, p in items:
        if q.startswith(pre):
            run.append((q, p))
        elif run:
            flush()
        out[q] = p
    flush()
    return out


def _finish(graph, model, spec, batch, inputs, path):
    from .unknown import unknown_ops
    cfg = dict(spec.config) if spec else {}
    seq = cfg.get("s")
    if seq is None:
        first = next((x for x in inputs if hasattr(x, "dim") and x.dim() == 2 and not x.is_floating_point()), None)
        seq = int(first.shape[1]) if first is not None else None
    graph.meta.update({
        "model": spec.name if spec else type(model).__name__,
        "kind": spec.kind if spec else "custom",
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items()},
        "seq": seq,
        "params": int(sum(p.numel() for p in model.parameters())),
        "batch": int(batch),
        "capture": path,
        # the MoE layers expert parallelism can run (search/joint/ep.py offers ep > 1 for these only)
        "ep_modules": _ep_modules(model),
    })
    graph.meta["unknown_ops"] = unknown_ops(graph)
    from .batchy import batch_stat_modules
    bn = batch_stat_modules(model)      # in training mode here (capture's root.train()), ran or not
    if bn:
        graph.meta["batch_stat_modules"] = bn
    from .batchy import unsynced_buffers
    # buffers written from the batch outside those modules: no layout may split the batch (batchy.py)
    written = unsynced_buffers(graph.meta.pop("batch_buffers", []), bn)
    if written:
        graph.meta["batch_buffers"] = written
    graph.batch_size = int(batch)
    return graph


def _ep_modules(model) -> list:
    from ..models.moe import ep_capable
    return sorted(n for n, m in model.named_modules() if ep_capable(m))


class _ModuleTracker:
    """Keeps the stack of modules whose forward is running, so a tracing error can name the
    innermost module it happened in."""

    def __init__(self, root, strip):
        self.root, self.strip, self.stack, self.handles, self.last_fail = root, strip, [], [], None

    def __enter__(self):
        for q, m in self.root.named_modules():
            q = q[len(self.strip):] if self.strip and q.startswith(self.strip) else q
            self.handles.append(m.register_forward_pre_hook(self._pre(q, m)))
            self.handles.append(m.register_forward_hook(self._post()))
        return self

    def _pre(self, q, m):
        def hook(mod, args):
            self.stack.append((q, type(m).__name__))
        return hook

    def _post(self):
        def hook(mod, args, out):
            if self.stack:
                self.stack.pop()
        return hook

    def failed_at(self):
        return self.stack[-1] if self.stack else None

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        return False


def _explain(err, where, root, ours=False):
    msg = " ".join(str(err).split())
    low = msg.lower()
    if ours:
        short = msg[:160] + ("..." if len(msg) > 160 else "")
        return (f"sapp could not read the traced graph of {type(root).__name__}{_op_at(err)}: {type(err).__name__}: {short}; "
                "torch traced your model and inputs fine - this is a gap in sapp's capture: report it with this line")
    if "past_key_values" in low or "cache" in low:
        hint = "for Hugging Face models set use_cache=False in the config"
    elif "data-dependent" in low or "data dependent" in low or "guard" in low or "item()" in low:
        what = getattr(err, "sapp_hint", None) or ("from Python, capture it with real parameters and example inputs "
                                                    "(sapp.search(model_on_cpu, cluster, example_inputs=...); no CLI flag "
                                                    "does this)")
        hint = (f"avoid Python control flow on tensor values in forward (use torch.where / torch.cond), or {what}: "
                "the branch then follows their values")
    elif "argument" in low or "positional" in low or "missing" in low:
        hint = "pass example_inputs matching forward(...)"
    else:
        hint = "pass example_inputs matching forward(...), or make the failing module traceable"
    loc = f" in module '{where[0] or '<root>'}' ({where[1]})" if where else ""
    short = msg[:200] + ("..." if len(msg) > 200 else "")
    return f"cannot capture {type(root).__name__}{loc}{_op_at(err)}: {type(err).__name__}: {short}; {hint}"


def _op_at(err) -> str:
    """' at FILE:LINE `source`': the innermost frame of the error's traceback outside torch, Python's
    library and sapp's capture machinery - the model's line (the op) that failed; '' when none."""
    import os
    import sysconfig
    import torch
    from sapp.errors import user_frame
    got = user_frame(err, (os.path.dirname(torch.__file__), sysconfig.get_paths()["stdlib"], os.path.dirname(__file__)))
    if got is None:
        return ""
    name, line, src = got
    return f" at {name}:{line}" + (f" `{src}`" if src else "")


class _CallableModule(__import__("types").ModuleType):
    """Importing this package rebinds `sapp.capture` (the function in sapp/__init__.py) to the
    package; making the package callable keeps `sapp.capture(model, ...)` working either way."""

    def __call__(self, model, example_inputs=None, **kwargs):
        return capture(model, example_inputs, **kwargs)


__import__("sys").modules[__name__].__class__ = _CallableModule
