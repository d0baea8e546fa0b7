"""Modules that normalise by batch statistics, read off the module tree (not the graph): a branch the
example inputs do not take (Granite Speech's audio encoder, run only with audio features) holds
BatchNorms the captured graph never shows, yet the emitter refuses any train-mode one under a split
batch (emit/checks.check_batch_statistics).  Capture records them so the search plans what the
emitter runs.

Any other buffer the forward writes from the batch (an EMA of activations, a running statistic of a
class of its own) is read off the exported program itself: torch.export lists every buffer the
forward mutates (`graph_signature` outputs of kind BUFFER_MUTATION), and the written value is from
the batch when the user inputs are among its producers.  Under a split batch (dp, cp, micro-batches)
each rank would update it from its own part of the batch (an EMA model: 2.3e-4 off one process after
3 dp2 steps), which sapp cannot sync in general: capture records them (`batch_buffers`) and the
search and the emitter keep such a model on one whole batch per step.  A buffer written from
constants or from itself only (a step counter, a rotary cache) is the same on every rank and stays
allowed."""
from __future__ import annotations

import torch
from torch import nn


def is_batchy(mod: nn.Module) -> bool:
    """A torch BatchNorm, or any layer keeping running batch statistics (HF's own batch norms)."""
    return isinstance(mod, nn.modules.batchnorm._BatchNorm) or (
        isinstance(getattr(mod, "running_mean", None), torch.Tensor) and hasattr(mod, "momentum"))


def batch_stat_modules(model: nn.Module) -> dict:
    """{qualname: "torch" | "other"} of the train-mode modules normalising by batch statistics
    ("other": a class the emitter cannot sync over dp), in module order."""
    return {name: "torch" if isinstance(mod, nn.modules.batchnorm._BatchNorm) else "other"
            for name, mod in model.named_modules() if mod.training and is_batchy(mod)}


def written_from_batch(ep, strip: str = "", skip=frozenset()) -> list:
    """Qualnames (without `strip`) of the buffers the exported program `ep` writes from its user
    inputs, sorted.  torch 2.13 exports the training IR, whose in-place ops stay in place and whose
    signature lists no mutation; the functional program (run_decompositions with an empty table) lists
    them.  It is built only when an in-place op writes a buffer (_writes_buffer), so a model that
    writes none pays nothing; nor does one writing only the buffers of the modules `skip` names (its
    batch norms, which batch_stat_modules covers)."""
    from torch.export.graph_signature import InputKind, OutputKind
    if not any(s.kind == OutputKind.BUFFER_MUTATION for s in ep.graph_signature.output_specs):
        bufs = {s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.BUFFER
                and s.target.rpartition(".")[0] not in skip}
        if not _writes_buffer(ep.graph_module, bufs):
            return []
        import warnings
        with warnings.catch_warnings():         # torch's own deprecation notes from its deepcopy
            warnings.simplefilter("ignore")
            ep = ep.run_decompositions({})
    sig = ep.graph_signature
    users = {s.arg.name for s in sig.input_specs if s.kind == InputKind.USER_INPUT}
    nodes = {n.name: n for n in ep.graph.nodes}
    out = set()
    for s in sig.output_specs:
        if s.kind != OutputKind.BUFFER_MUTATION or getattr(s.arg, "name", None) not in nodes:
            continue
        seen, todo = set(), [nodes[s.arg.name]]
        while todo:                     # is a user input among the written value's producers?
            n = todo.pop()
            if n.name in seen:
                continue
            seen.add(n.name)
            if n.op == "placeholder" and n.name in users:
                out.add(s.target[len(strip):] if strip and s.target.startswith(strip) else s.target)
                break
            todo.extend(n.all_input_nodes)
    return sorted(out)


def _writes_buffer(gm, bufs: set) -> bool:
    """Whether an in-place op of `gm`'s graph (or of a higher-order op's subgraph: a `torch.no_grad()`
    block is one) writes a tensor viewing one of the placeholders named `bufs`."""
    import torch.fx as fx
    root = {}                           # node -> whether it is (a view of) a buffer
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            root[n] = n.name in bufs
            continue
        if n.op != "call_function":
            continue
        ins = [a for a in n.args if isinstance(a, fx.Node)]
        sub = next((getattr(gm, a.target) for a in ins if a.op == "get_attr"
                    and isinstance(getattr(gm, a.target, None), fx.GraphModule)), None)
        if sub is not None:             # a subgraph: its placeholders are the tensor arguments, in order
            args = [a for a in ins if a.op != "get_attr"]
            phs = [p.name for p in sub.graph.nodes if p.op == "placeholder"]
            if _writes_buffer(sub, {p for p, a in zip(phs, args) if root.get(a)}):
                return True
            continue
        schema = getattr(n.target, "_schema", None)
        if schema is None:
            root[n] = False
            continue
        written = [a for a, spec in zip(n.args, schema.arguments) if spec.alias_info is not None
                   and spec.alias_info.is_write]
        if any(root.get(a) for a in written if isinstance(a, fx.Node)):
            return True
        # a view (or an in-place op's result) aliases its first argument
        aliased = bool(schema.returns) and schema.returns[0].alias_info is not None
        root[n] = aliased and bool(ins) and bool(root.get(n.args[0]))
    return False


def unsynced_buffers(names, bn: dict) -> list:
    """`names` less the buffers of the batch-statistics modules `bn` lists (those follow their own
    rules: a torch BatchNorm's are synced over dp, emit/dp/batch_stats.py)."""
    return [q for q in names if q.rpartition(".")[0] not in bn]

