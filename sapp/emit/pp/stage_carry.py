"""Values a pipeline stage reads from further back than the stage right before it, carried through.

The emitted pipeline builds each stage as a plain `PipelineStage`: stage i > 0 is called with exactly
what stage i-1 returned.  torch's split hands a stage every value it reads from wherever it was made,
so a stage that reads a model input (DeepSeek-V4's hash-routed MoE picks experts by `input_ids` in
every layer) or a value made two or more stages back (an encoder output read by every decoder stage
of a 4-stage cut) gets a forward argument nobody passes: "forward() missing 1 required positional
argument: 'input_ids'".  Before the cut, every such value is copied (`aten.clone`, differentiable) at
the end of each stage it has to cross, and the later stages read the copy.  Each boundary then sends
it once, which is what the cost model prices (sapp/pipeline/boundary.py: a tensor made at or before
a cut and read after it is sent at that cut, a model input included; the loss target is not: the
schedule hands it to the last stage's loss).  Position-only values never need this: every stage
makes its own (stage_local.py, run first)."""
from __future__ import annotations

import torch
from torch import fx

from .stage_local import COPY, _stages


def _root_stack(graph: fx.Graph):
    """The outermost entry of the graph's module stacks (the model itself, path ''): a carried copy
    sits at the stage's top level, in no block's module (the outliner needs a non-empty stack on
    every op)."""
    for n in graph.nodes:
        stack = n.meta.get("nn_module_stack")
        if stack:
            k, v = next(iter(stack.items()))
            return {k: v}
    return None


def carry_values(gm: fx.GraphModule) -> fx.GraphModule:
    """Route every value read beyond the next stage through the stages between (in place; returns gm)."""
    graph = gm.graph
    stage, opener = _stages(graph)
    last = max(stage.values(), default=0)
    if last == 0:
        return gm
    root = _root_stack(graph)
    changed = False
    for v in list(graph.nodes):
        if v.op not in ("placeholder", "call_function") or not _is_tensor(v):
            continue
        # the first boundary v must be carried over: stage 0 is handed the model inputs, so an input
        # read from stage 1 on is copied at the end of stage 0; a value of stage d reaches stage d+1
        # as it is, and is copied at the end of d+1 for stage d+2 and on
        first = 1 if v.op == "placeholder" else stage[v] + 2
        users = [u for u in v.users if stage[u] >= first]
        if not users:
            continue
        cur = v
        for k in range(first, max(stage[u] for u in users) + 1):
            with graph.inserting_before(opener[k]):       # the end of stage k-1
                c = graph.call_function(torch.ops.aten.clone.default, (cur,))
            c.meta = {key: val for key, val in cur.meta.items() if key in ("val", "tensor_meta")}
            c.meta[COPY] = True
            if root is not None:
                c.meta["nn_module_stack"] = dict(root)
            for u in users:
                if stage[u] >= k:
                    u.replace_input_with(cur, c)
            stage[c] = k - 1
            cur = c
            changed = True
    if not changed:
        return gm
    graph.lint()
    gm.recompile()
    return gm


def _is_tensor(v: fx.Node) -> bool:
    val = v.meta.get("val")
    return torch.is_tensor(val) if val is not None else True
