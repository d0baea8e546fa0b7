"""Repairs between torch.export and a runnable pipeline stage, each for a failure real models hit.

- `inline_grad_regions`: a `torch.no_grad()` / `torch.autocast` region in forward (HF rotary
  embeddings) exports as a higher-order op that takes its body as a sub-GraphModule argument; the
  pipeline's module outliner turns that argument into a missing input ("forward() missing 2 required
  positional arguments: 'unsqueeze_default' and 'submod_1'").  We inline the body and, for a no-grad
  region, detach its outputs: gradients stop there exactly as they did under no_grad -- except an
  output that is one of the region's inputs handed back unchanged (`x.to(x.dtype)`), which eager
  returns as the same tensor, history and all.
- `drop_metadata_asserts`: export records every `.to(dtype)` as an `aten._assert_tensor_metadata`
  check beside the copy; DTensor has no sharding rule for it, so a stage module that runs on DTensors
  (a sequence-parallel norm: HF's RMSNorm casts to fp32) fails there.  The check only repeats what the
  trace fixed (the dtype and device of a value it produced), so it is dropped.
- `rejoin_module_paths`: module stacks recorded relative to a patched split block made whole again
  (the outliner refuses them: OpenAI GPT, XLM), and a shared module's calls made its callers' ops
  (x-transformers' one position bias called by every layer).
- `one_buffer_path` / `shared_buffers_unlisted`: a buffer module shared by several blocks
  (torchtune's one rotary table, set as every layer's `attn.pos_embeddings` and called for q and k)
  is read in the exported graph under its last path (`layers.3.attn.pos_embeddings.cache`), while
  torch's split gives each stage the buffer under the path it is read by and then looks it up under
  every path the model's state_dict names it by -- also in modules the stage never got it in (the
  second call `pos_embeddings@1`, `layers.2` of a stage cut before it): "'InterpreterModule' object
  has no attribute 'cache'", reported as a torch.export failure.  Every read is pointed at the
  buffer's first path, and while the split runs the shared buffer is left out of the state_dict, so
  torch looks it up under that one path, which each stage reading it then holds: the buffer is
  replicated to each stage that reads it, as a weight two stages use.
- `compiled_stage`: run each stage sub-module's generated code instead of the fx interpreter (speed),
  renaming graph values called `self` first (BERT has a sub-module named `self`, whose result would
  shadow the method's `self`: "'Tensor' object has no attribute 'output'"), and make the stage's
  outputs contiguous (gloo's isend refuses strided views: ViT's sliced CLS token)."""
from __future__ import annotations

import contextlib
import operator

import torch
from torch import fx, nn


def _body_index(node: fx.Node, gm: fx.GraphModule):
    for i, a in enumerate(node.args):
        if isinstance(a, fx.Node) and a.op == "get_attr" and isinstance(getattr(gm, a.target, None), fx.GraphModule):
            return i
    return None


def _is_region(node: fx.Node) -> bool:
    return node.op == "call_function" and type(node.target).__name__ in ("WrapWithSetGradEnabled", "WrapWithAutocast")


# ops that return their input itself when nothing changes (`x.to(x.dtype)`, `x.float()` on float32,
# `.contiguous()` on a contiguous tensor): the same object, so the same autograd history
_SELF_RETURNING = {"aten.to.dtype", "aten.to.dtype_layout", "aten.to.device", "aten.to.other",
                   "aten.contiguous.default", "aten.type_as.default"}


def _unchanged(node: fx.Node) -> bool:
    a, b = node.args[0].meta.get("val"), node.meta.get("val")
    if not (torch.is_tensor(a) and torch.is_tensor(b)):
        return False
    schema = getattr(node.target, "_schema", None)
    for i, arg in enumerate(schema.arguments if schema is not None else ()):
        if arg.name == "copy" and (node.args[i] if i < len(node.args) else node.kwargs.get("copy")):
            return False                # copy=True: a new tensor, detached under no_grad
    return (a.dtype, a.device, a.layout, tuple(a.shape), a.is_contiguous()) == \
           (b.dtype, b.device, b.layout, tuple(b.shape), b.is_contiguous())


def _returns_operand(r: fx.Node, env: dict):
    """The parent-graph operand that a no-grad region's output `r` IS in eager, or None.

    Under no_grad, `h.to(h.dtype)` returns `h` itself, still on the autograd graph; export then records
    the caller's later uses of `h` as uses of the region's output (DeepSeek-V3.2-style sparse-attention
    indexers call `hidden_states.to(...)` inside no_grad, and the attention's gate reads hidden_states
    after it).  Detaching that output cut the gradient of every such later use: a pipeline stage
    trained to wrong losses with no error."""
    while r.op == "call_function" and str(r.target) in _SELF_RETURNING and isinstance(r.args[0], fx.Node) \
            and _unchanged(r):
        r = r.args[0]
    return env[r] if r.op == "placeholder" else None


def inline_grad_regions(gm: fx.GraphModule) -> fx.GraphModule:
    """Inline every grad-mode / autocast higher-order region of `gm` (in place; returns gm)."""
    graph = gm.graph
    for node in [n for n in graph.nodes if _is_region(n)]:
        i = _body_index(node, gm)
        if i is None:
            continue
        holder = node.args[i]
        body = getattr(gm, holder.target)
        no_grad = type(node.target).__name__ == "WrapWithSetGradEnabled" and node.args[0] is False
        operands = list(node.args[i + 1:])
        env, out = {}, None
        with graph.inserting_before(node):
            k = 0
            for bn in body.graph.nodes:
                if bn.op == "placeholder":
                    env[bn] = operands[k]
                    k += 1
                elif bn.op == "output":
                    out = bn.args[0]
                elif bn.op == "get_attr":       # a constant of the body: move it to the parent
                    name = f"_inlined_{holder.target}_{bn.target}".replace(".", "_")
                    setattr(gm, name, getattr(body, bn.target))
                    env[bn] = graph.get_attr(name)
                else:
                    env[bn] = graph.node_copy(bn, lambda a: env[a])
                    env[bn].meta = dict(bn.meta)
            results = []
            for r in (out if isinstance(out, (tuple, list)) else (out,)):
                v = env[r] if isinstance(r, fx.Node) else r
                same = _returns_operand(r, env) if no_grad and isinstance(r, fx.Node) else None
                if same is not None:      # eager handed back the caller's own tensor, history and all
                    v = same
                elif no_grad and isinstance(v, fx.Node):
                    d = graph.call_function(torch.ops.aten.detach.default, (v,))
                    d.meta = dict(v.meta)
                    v = d
                results.append(v)
        if isinstance(out, (tuple, list)):
            for user in list(node.users):
                if user.op == "call_function" and user.target is operator.getitem:
                    user.replace_all_uses_with(results[user.args[1]])
                    graph.erase_node(user)
        else:
            node.replace_all_uses_with(results[0])
        if not node.users:
            graph.erase_node(node)
            if not holder.users:
                graph.erase_node(holder)
                gm.delete_submodule(holder.target)
    graph.lint()
    gm.recompile()
    return gm


def drop_metadata_asserts(gm: fx.GraphModule) -> fx.GraphModule:
    """Erase the unused `aten._assert_tensor_metadata` nodes of `gm` and its sub-graphs (in place)."""
    target = torch.ops.aten._assert_tensor_metadata.default
    for sub in gm.modules():
        if not isinstance(sub, fx.GraphModule):
            continue
        dead = [n for n in sub.graph.nodes if n.op == "call_function" and n.target is target and not n.users]
        for n in dead:
            sub.graph.erase_node(n)
        if dead:
            sub.recompile()
    return gm


def rejoin_module_paths(gm: fx.GraphModule, names) -> fx.GraphModule:
    """Make every node's module stack a chain of paths, each inside the one before (in place).

    With a split point's forward patched (annotate_split_points), torch.export records some models'
    modules inside that block under paths relative to it (OpenAI GPT, XLM: `attn` and `attn.c_attn`
    under `transformer.h.1`), and torch's module outliner refuses them ("Child module 'attn' is not
    a descendant of parent module 'transformer.h.1'").  An entry whose path names no module of the
    model (`names`) but does under the entry before is that relative path: it and every entry after
    it get that entry's path as prefix.

    A real module called from one it is not inside (x-transformers' one relative-position bias, a
    child of the decoder handed to every attention layer, which calls it) is refused by the outliner
    too ("Child module 'attn_layers.rel_pos' is not a descendant of parent module
    'attn_layers.layers.2.1'"); its entry and those after it are dropped, as torch.export's own
    unflatten does: its ops become the calling layer's, and every stage calling it holds a copy of its
    weights and buffers (a weight several stages use; pipe.TiedGrads sums their gradients)."""
    for n in gm.graph.nodes:
        stack = n.meta.get("nn_module_stack")
        if not stack:
            continue
        items, base, out, changed = list(stack.items()), None, [], False
        for i, (key, (path, ty)) in enumerate(items):
            prev = out[-1][1][0] if out else ""
            if base is None and i > 0 and prev and path not in names and f"{prev}.{path}" in names:
                base = prev
            if base is not None:       # the key names one call of the module: kept unique, "@n" kept
                head, at, idx = key.partition("@")
                key, path, changed = f"{head}__in__{base}{at}{idx}", f"{base}.{path}", True
            elif i > 0 and not _inside(path, prev):
                # a module called from one it is not inside (a shared position bias): its ops are the
                # caller's (see the docstring)
                changed = True
                break
            out.append((key, (path, ty)))
        if changed:
            n.meta["nn_module_stack"] = dict(out)
    return gm


def _inside(path: str, parent: str) -> bool:
    return not parent or path.startswith(parent + ".")


def buffer_aliases(model: nn.Module) -> dict:
    """{second or later path of a buffer: its first path} -- the paths a shared module gives it."""
    first = {id(b): n for n, b in model.named_buffers()}
    return {n: first[id(b)] for n, b in model.named_buffers(remove_duplicate=False) if first[id(b)] != n}


@contextlib.contextmanager
def shared_buffers_unlisted(model: nn.Module):
    """Leave the buffers of shared modules out of `model`'s state_dict while torch splits it (see the
    module docstring), as they were on exit."""
    aliases = buffer_aliases(model)
    added = []
    for path in set(aliases) | set(aliases.values()):
        parent, _, leaf = path.rpartition(".")
        owner = model.get_submodule(parent)
        if leaf not in owner._non_persistent_buffers_set:
            owner._non_persistent_buffers_set.add(leaf)
            added.append((owner, leaf))
    try:
        yield
    finally:
        for owner, leaf in added:
            owner._non_persistent_buffers_set.discard(leaf)


def one_buffer_path(gm: fx.GraphModule, aliases: dict) -> fx.GraphModule:
    """Point every get_attr of a shared buffer at its first path (in place; see the module docstring).
    The exported module holds the buffer under each of its paths, so the first one is there."""
    changed = False
    for n in gm.graph.nodes:
        target = aliases.get(n.target) if n.op == "get_attr" else None
        if target is not None and _has_attr(gm, target):
            n.target, changed = target, True
    if changed:
        gm.recompile()
    return gm


def _has_attr(obj, path: str) -> bool:
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return False
    return torch.is_tensor(obj)


def prepare(gm: fx.GraphModule, names=frozenset(), aliases=None) -> fx.GraphModule:
    """The repairs made on the exported graph before it is cut into stages (Pipe's split_policy;
    `names`: the model's module names; `aliases`: buffer_aliases of the model);
    then every stage gets its own copy of the position-only values it reads (stage_local.py), so
    what crosses a boundary is what carries data; last, a value read further on than the next stage
    (a model input from stage 1 on) is carried through the stages between (stage_carry.py)."""
    from .stage_carry import carry_values
    from .stage_local import recompute_position_tensors
    gm = one_buffer_path(rejoin_module_paths(gm, names), aliases or {})
    return carry_values(recompute_position_tensors(inline_grad_regions(drop_metadata_asserts(gm))))


def _contiguous(out):
    if torch.is_tensor(out):
        return out.contiguous()
    if isinstance(out, (tuple, list)):
        return type(out)(o.contiguous() if torch.is_tensor(o) else o for o in out)
    return out


class _ContiguousGrad(torch.autograd.Function):
    """Identity forward; backward hands the gradient on contiguous."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g.contiguous()


def _contiguous_grads(args):
    return tuple(_ContiguousGrad.apply(a) if torch.is_tensor(a) and a.requires_grad else a for a in args)


def compiled_stage(mod: nn.Module) -> nn.Module:
    """A private stage copy that runs generated code (in place), contiguous both ways at its edges:
    it returns contiguous tensors, and the gradients it hands back for its inputs are contiguous.
    PipelineStage receives into buffers laid out like what it inferred, and gloo can neither send nor
    receive a strided tensor (ViT's sliced CLS token forward; ConvNeXt V2's channels-last permute
    backward: "input tensor has to be contiguous" at step 0)."""
    # torch.export's InterpreterModules run node by node through torch.fx.Interpreter by default:
    # about 30 us of Python per node per call (a gpt-small stage: 6-7 ms per micro-batch); each also
    # holds the generated code of the same graph, which we run instead
    for sub in mod.modules():
        gmod = getattr(sub, "graph_module", None)
        if gmod is None or not hasattr(sub, "_run_with_interpreter"):
            continue
        clash = [n for n in sub.graph.nodes if n.name == "self"]
        for n in clash:
            n._rename("self_out")
        if clash:
            gmod.recompile()
        sub._run_with_interpreter = False
    inner = mod.forward

    def forward(*args, **kwargs):
        return _contiguous(inner(*_contiguous_grads(args), **kwargs))

    mod.forward = forward
    return mod
