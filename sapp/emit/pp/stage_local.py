"""Values every pipeline stage computes for itself instead of receiving them from the stage before.

Hugging Face decoders (Llama, Qwen2, Mistral, GPT-NeoX, ...) build the attention mask and the rotary
cos/sin once, before layer 0, and hand them to every layer.  Cut into stages, torch's pipeline would
send them along with the residual stream at every forward send (no gradient): 3 KB per send on the
tiny Llama on top of the priced 2 KB, and with eager attention the mask is (b, 1, s, s), which
dominates the send at long sequences.  They depend only on shapes and constants (arange positions,
the causal pattern, the rotary inv_freq buffer), not on the data, so each stage that reads one gets
its own copy of the ops producing it, placed at the start of that stage, on the exported graph before
it is cut.  What crosses a boundary is then only what carries data, which is what the cost model
prices (sapp/pipeline/boundary.py follows the same rule on the captured graph; tensors that do
depend on the data, e.g. a mask built from an `attention_mask` input, are priced there instead).

A node is position-only when it is a pure, deterministic ATen op (not mutating, not random, not
`empty`) whose inputs are constants, buffers or other position-only nodes -- never a graph input or a
trainable parameter."""
from __future__ import annotations

import operator

import torch
from torch import fx


COPY = "sapp_stage_local"     # node.meta key of a copy (split_module and the outliner keep node meta)


def _split_op():
    return torch.ops.pippy._pipe_split.default


def _attr(gm: fx.GraphModule, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _pure(node: fx.Node) -> bool:
    t = node.target
    if t is operator.getitem:
        return True
    if not isinstance(t, torch._ops.OpOverload) or t is _split_op():
        return False
    if t._schema.is_mutable or torch.Tag.nondeterministic_seeded in t.tags:
        return False
    return not t._schema.name.startswith("aten::empty")    # uninitialised values differ per copy


def _mutated_attrs(gm: fx.GraphModule) -> set:
    """get_attr targets some op writes to (a buffer updated in forward is state, not a constant)."""
    out = set()
    for n in gm.graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        for arg, a in zip(n.target._schema.arguments, n.args):
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(a, fx.Node) \
                    and a.op == "get_attr":
                out.add(a.target)
    return out


def position_only(gm: fx.GraphModule) -> set:
    """The position-only call_function nodes of `gm` (see the module docstring)."""
    mutated = _mutated_attrs(gm)
    const, out = set(), set()
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            v = _attr(gm, n.target)
            trainable = isinstance(v, torch.nn.Parameter) or (torch.is_tensor(v) and v.requires_grad)
            if not trainable and n.target not in mutated:
                const.add(n)
        elif n.op == "call_function" and _pure(n):
            if all(a in const or a in out for a in n.all_input_nodes):
                out.add(n)
    return out


def _stages(graph: fx.Graph):
    """(stage index of every node, the pipe_split node opening each stage > 0), as the pipeline's
    split callback counts them: a node belongs to the stage of the last pipe_split before it."""
    split, stage, opener, i = _split_op(), {}, {}, 0
    for n in graph.nodes:
        if n.op == "call_function" and n.target is split:
            i += 1
            opener[i] = n
        stage[n] = i
    return stage, opener


def recompute_position_tensors(gm: fx.GraphModule) -> fx.GraphModule:
    """Give every stage that reads a position-only value from an earlier stage its own copy of the
    ops producing it (in place; returns gm).  Copies run at the stage's top level (the root entry of
    the originals' module stack) and are marked `COPY`; buffers they read (inv_freq) are moved into
    that stage by the pipeline like any attribute two stages use."""
    graph = gm.graph
    pos = position_only(gm)
    stage, opener = _stages(graph)
    order = {n: k for k, n in enumerate(graph.nodes)}
    copies, tail = {}, dict(opener)     # (stage, original) -> its copy; stage -> last node inserted
    for user in list(graph.nodes):
        s = stage[user]
        for a in [a for a in user.all_input_nodes if a in pos and stage[a] < s]:
            _copy_into(graph, a, s, pos, order, copies, tail)
            user.replace_input_with(a, copies[(s, a)])
    if not copies:
        return gm
    for n in reversed(list(graph.nodes)):       # originals now read by no stage at all
        if n in pos and not n.users:
            graph.erase_node(n)
    graph.lint()
    gm.recompile()
    return gm


def _copy_into(graph, node, s, pos, order, copies, tail):
    """Copy `node` and its position-only ancestors that stage `s` does not have yet, in graph order,
    after the pipe_split opening stage s and the copies made there before (so they run before
    anything of the stage reads them; a copy reads the same stage's copies or the shared get_attrs)."""
    need, stack = set(), [node]
    while stack:
        n = stack.pop()
        if (s, n) in copies or n in need:
            continue
        need.add(n)
        stack.extend(a for a in n.all_input_nodes if a in pos)
    for n in sorted(need, key=order.__getitem__):
        with graph.inserting_after(tail[s]):
            c = graph.node_copy(n, lambda a: copies.get((s, a), a))
        # marked: the manifest does not count a block as run by stage s for its copies alone
        c.meta = dict(n.meta, **{COPY: True})
        stack = n.meta.get("nn_module_stack")
        if stack:
            # at the stage's top level: kept in the original's modules, the copies would call a module
            # the stage calls again later for its own work (Gemma 4's rotary table in
            # `model.language_model`, then its layers), which the module outliner cannot tell apart
            c.meta["nn_module_stack"] = dict([next(iter(stack.items()))])
        copies[(s, n)] = tail[s] = c
