"""Repeated blocks: which module a node belongs to, which blocks are structurally identical, and
the capture accelerator that replicates one captured block to the full depth."""
from __future__ import annotations

from torch import nn

from ..ir import OpNode, Operand


def container_children(model, strip: str = "") -> set:
    """Qualnames of the children of every nn.ModuleList / nn.Sequential."""
    out = set()
    for qn, m in model.named_modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)):
            for child in m._modules:
                q = f"{qn}.{child}" if qn else child
                if strip and q.startswith(strip):
                    q = q[len(strip):]
                out.add(q)
    return out


def assign_blocks(nodes: dict, scopes: dict, candidates: set) -> dict:
    """Set node.block to the OUTERMOST enclosing container child; return {block: [names]} in
    order of first appearance."""
    blocks = {}
    for name, node in nodes.items():
        for path in scopes.get(name, ()):
            if path in candidates:
                node.block = path
                blocks.setdefault(path, []).append(name)
                break
    return blocks


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
    """The nn.ModuleList holding the most parameters among those with 3+ children that all have
    the same class and the same parameter/buffer shapes: (qualname, parent, attr, length) or None."""
    best = None
    for qn, m in model.named_modules():
        if type(m) is not nn.ModuleList or len(m) < 3:
            continue
        sigs = {_module_sig(c) for c in m}
        if len(sigs) != 1:
            continue
        size = sum(p.numel() for p in m.parameters())
        if best is None or size > best[0]:
            parent_q, _, attr = qn.rpartition(".")
            best = (size, qn, model.get_submodule(parent_q) if parent_q else model, attr, len(m))
    return None if best is None else best[1:]


def _module_sig(m):
    return (type(m), tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in m.named_parameters()),
            tuple((n, tuple(b.shape), b.dtype) for n, b in m.named_buffers()))


def expand_blocks(nodes: dict, outputs: tuple, blocks: dict, lq: str, depth: int):
    """Graph captured with `lq` truncated to 2 blocks -> the graph of the full `depth`.  Block k >= 2
    is a copy of block 1 whose inputs from block 0 come from block k-1 and whose parameters/modules
    are renamed lq.1 -> lq.k; nodes after the stack read block depth-1.  Returns (nodes, outputs,
    blocks) or None when the captured graph does not have that shape (then capture the full model)."""
    b0, b1 = f"{lq}.0", f"{lq}.1"
    if b0 not in blocks or b1 not in blocks:
        return None
    n0, n1 = blocks[b0], blocks[b1]
    if block_signature(nodes, b0, n0) != block_signature(nodes, b1, n1):
        return None
    order = list(nodes)
    start = order.index(n0[0])
    if order[start:start + len(n0) + len(n1)] != n0 + n1:
        return None                     # blocks not contiguous: something runs between them
    prefix, suffix = order[:start], order[start + len(n0) + len(n1):]
    if any(nodes[x].block in (b0, b1) for x in suffix + prefix):
        return None
    i0, i1 = {x: i for i, x in enumerate(n0)}, {x: i for i, x in enumerate(n1)}
    layer = {0: n0, 1: n1}
    new = {x: nodes[x] for x in prefix + n0 + n1}
    for k in range(2, depth):
        names = [f"{x}__rep{k}" for x in n1]
        for x, nm in zip(n1, names):
            n = nodes[x]
            ops = []
            for o in n.operands:
                p = o.producer
                if p in i1:
                    p = names[i1[p]]
                elif p in i0:
                    p = layer[k - 1][i0[p]]
                ops.append(Operand(o.shape, o.dtype, o.dims, p, _rename(o.param, b1, f"{lq}.{k}")))
            new[nm] = OpNode(nm, n.kind, n.target, n.dims, tuple(ops), n.out, n.flops, n.bytes, n.saves,
                             _rename(n.module, b1, f"{lq}.{k}"), f"{lq}.{k}", dict(n.extra))
        layer[k] = names
    last = layer[depth - 1]
    for x in suffix:
        n = nodes[x]
        ops = tuple(Operand(o.shape, o.dtype, o.dims, last[i1[o.producer]] if o.producer in i1 else o.producer,
                            o.param) for o in n.operands)
        new[x] = OpNode(n.name, n.kind, n.target, n.dims, ops, n.out, n.flops, n.bytes, n.saves, n.module,
                        n.block, dict(n.extra))
    outs = tuple(last[i1[o]] if o in i1 else o for o in outputs)
    nb = {}
    for b, names in blocks.items():
        if b == b1:
            for k in range(1, depth):
                nb[f"{lq}.{k}"] = list(layer[k])
        else:
            nb[b] = list(names)
    return new, outs, nb


def _rename(q, old, new):
    if q is None:
        return None
    if q == old:
        return new
    if q.startswith(old + "."):
        return new + q[len(old):]
    return q
