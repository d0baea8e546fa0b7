"""Repeated blocks: which module a node belongs to, which blocks are structurally identical, and
the capture accelerator that replicates one captured block to the full depth.

A deep list of identical blocks is traced with 3 of them and stamped to full depth (checked equal to
a direct capture: GPT-3 175B captures in about a second); blocks of another kind before that run
(DeepSeek-V3's dense blocks before its MoE ones) are traced as they are (`repeated_list` says where
the run starts).  Candidates come from one list (`container_children`: ModuleList / ModuleDict
children, never the containers), which the plan's and the emitter's stage lists share.  A block its
parent calls as `layer.forward(...)` (SqueezeBERT) runs no hook and no trace stack names it: such a
candidate owns the ops of the modules under it (`assign_blocks`); an entered block keeps only the ops
run inside it.  `block_groups` lists structurally identical blocks (same node count, kinds and
shapes, in order), which the search prices once."""
from __future__ import annotations

from torch import nn

from sapp.capture.ir import OpNode, Operand


def container_children(model, strip: str = "") -> set:
    """Qualnames of the children of every nn.ModuleList / nn.Sequential that can be a block: not
    themselves a ModuleList / ModuleDict (never called, so never a scope: PoolFormer's
    `encoder.block.0` is a ModuleList and its blocks are `encoder.block.0.0`, ...).  The one list of
    block candidates: capture assigns operators to them and the emitter's manifest names a pipeline
    stage's blocks by it (sapp/emit/checks/manifest.py)."""
    out = set()
    for qn, m in model.named_modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)):
            for child, sub in m._modules.items():
                if isinstance(sub, (nn.ModuleList, nn.ModuleDict)):
                    continue
                q = f"{qn}.{child}" if qn else child
                if strip and q.startswith(strip):
                    q = q[len(strip):]
                out.add(q)
    return out


def assign_blocks(nodes: dict, scopes: dict, candidates: set) -> dict:
    """Set node.block to the OUTERMOST enclosing container child; return {block: [names]} in
    order of first appearance.  A block its parent runs as `layer.forward(...)` (SqueezeBERT's
    encoder) calls no hook, so the trace's module stack never names it, only its submodules: a
    candidate no stack names owns the ops of the modules under it, as the emitter's stages hold it
    by the module tree.  (A block that is entered keeps only the ops run inside it: a module of its
    tree called from elsewhere, e.g. a rotary table called from the model's forward, stays out.)"""
    entered = {p for paths in scopes.values() for p in paths}
    blocks = {}
    for name, node in nodes.items():
        path = _enclosing(scopes.get(name, ()), candidates, entered)
        if path is not None:
            node.block = path
            blocks.setdefault(path, []).append(name)
    return blocks


def _enclosing(paths, candidates: set, entered: set):
    for path in paths:
        parts = path.split(".")
        for i in range(1, len(parts) + 1):
            q = ".".join(parts[:i])
            if q in candidates and (q == path or q not in entered):
                return q
    return None


def _rel(q, prefix):
    if q == prefix:
        return "."
    if q.startswith(prefix + "."):
        return "." + q[len(prefix) + 1:]
    return None


def block_signature(nodes: dict, block: str, names: list) -> tuple:
    """Structure of a block independent of its position: kinds, targets, dims, shapes, saves,
    in-block wiring (by index) and parameters relative to the block."""
    index = {n: i for i, n in enumerate(names)}
    sig = []
    for name in names:
        n = nodes[name]
        ops = []
        for o in n.operands:
            src = ("local", index[o.producer]) if o.producer in index else ("ext",) if o.producer else None
            p = None
            if o.param is not None:
                r = _rel(o.param, block)
                p = ("rel", r) if r is not None else ("abs", o.param)
            ops.append((o.shape, o.dtype, o.dims, src, p))
        sig.append((n.kind, n.target, n.dims, n.out, n.saves, _rel(n.module, block) or n.module,
                    tuple(ops), tuple(sorted(n.extra.items(), key=lambda kv: kv[0])).__repr__()))
    return tuple(sig)


def group_blocks(nodes: dict, blocks: dict) -> list:
    """Blocks with equal signatures, in order of appearance (singletons included)."""
    groups, by_sig = [], {}
    for b, names in blocks.items():
        s = block_signature(nodes, b, names)
        if s in by_sig:
            groups[by_sig[s]].append(b)
        else:
            by_sig[s] = len(groups)
            groups.append([b])
    return groups


def repeated_list(model):
    """The nn.ModuleList holding the most parameters among those that end in a run of 3+ children
    with the same class and the same parameter/buffer shapes (DeepSeek-V3's 3 dense blocks before 58
    MoE ones: the run is the MoE blocks): (qualname, parent, attr, length, start of the run) or None."""
    best = None
    for qn, m in model.named_modules():
        if type(m) is not nn.ModuleList or len(m) < 3:
            continue
        sigs = [_module_sig(c) for c in m]
        if sigs[-1] is None:        # a run of empty slots holds no block to replicate
            continue
        start = len(sigs) - 1
        while start > 0 and sigs[start - 1] == sigs[-1]:
            start -= 1
        if len(sigs) - start < 3:
            continue
        size = sum(p.numel() for p in m.parameters())
        if best is None or size > best[0]:
            parent_q, _, attr = qn.rpartition(".")
            best = (size, qn, model.get_submodule(parent_q) if parent_q else model, attr, len(m), start)
    return None if best is None else best[1:]


def _module_sig(m):
    if m is None:               # a list slot left empty (a layer a config switches off)
        return None
    return (type(m), tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in m.named_parameters()),
            tuple((n, tuple(b.shape), b.dtype) for n, b in m.named_buffers()))


def expand_blocks(nodes: dict, outputs: tuple, blocks: dict, lq: str, depth: int, kept: int = 3):
    """Graph captured with `lq` truncated to `kept` blocks -> the graph of the full `depth`.  The
    blocks before the last three may differ (a model's first, dense blocks): they stay as captured.

    The last captured block t = kept-1 is the template: block k > t is a copy of it whose inputs from
    block t-1 come from block k-1 (inputs from earlier blocks or from before the stack stay as they
    are, which three captured blocks let us tell apart from the chain), with parameters and modules
    renamed lq.t -> lq.k.  Nodes after the stack that read block t read block depth-1.  Returns
    (nodes, outputs, blocks), or None when the captured graph does not have that shape (the caller
    then captures the full model)."""
    t = kept - 1
    names = [f"{lq}.{i}" for i in range(kept)]
    if any(b not in blocks for b in names):
        return None
    lists = [blocks[b] for b in names]
    if block_signature(nodes, names[t - 1], lists[t - 1]) != block_signature(nodes, names[t], lists[t]):
        return None
    order = list(nodes)
    start = order.index(lists[0][0])
    stack = [x for lst in lists for x in lst]
    if order[start:start + len(stack)] != stack:
        return None                     # blocks not contiguous: something runs between them
    prefix, suffix = order[:start], order[start + len(stack):]
    if any(nodes[x].block in names for x in suffix + prefix):
        return None
    prev = {x: i for i, x in enumerate(lists[t - 1])}
    tmpl = {x: i for i, x in enumerate(lists[t])}
    layer = dict(enumerate(lists))
    new = {x: nodes[x] for x in prefix + stack}
    for k in range(kept, depth):
        clone = [f"{x}__rep{k}" for x in lists[t]]
        for x, nm in zip(lists[t], clone):
            n = nodes[x]
            ops = []
            for o in n.operands:
                p = o.producer
                if p in tmpl:
                    p = clone[tmpl[p]]
                elif p in prev:
                    p = layer[k - 1][prev[p]]
                ops.append(Operand(o.shape, o.dtype, o.dims, p, _rename(o.param, names[t], f"{lq}.{k}")))
            new[nm] = OpNode(nm, n.kind, n.target, n.dims, tuple(ops), n.out, n.flops, n.bytes, n.saves,
                             _rename(n.module, names[t], f"{lq}.{k}"), f"{lq}.{k}", dict(n.extra))
        layer[k] = clone
    last = layer[depth - 1]
    for x in suffix:
        n = nodes[x]
        ops = tuple(Operand(o.shape, o.dtype, o.dims, last[tmpl[o.producer]] if o.producer in tmpl else o.producer,
                            o.param) for o in n.operands)
        new[x] = OpNode(n.name, n.kind, n.target, n.dims, ops, n.out, n.flops, n.bytes, n.saves, n.module,
                        n.block, dict(n.extra))
    outs = tuple(last[tmpl[o]] if o in tmpl else o for o in outputs)
    nb = {}
    for b, v in blocks.items():
        if b == names[t]:
            for k in range(t, depth):
                nb[f"{lq}.{k}"] = list(layer[k])
        else:
            nb[b] = list(v)
    return new, outs, nb


def _rename(q, old, new):
    if q is None:
        return None
    if q == old:
        return new
    if q.startswith(old + "."):
        return new + q[len(old):]
    return q
