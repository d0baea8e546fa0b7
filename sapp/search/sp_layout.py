"""Megatron sequence parallelism (SP) on the tensor-parallel layouts of sapp/search/tp_layout.py.

Between two tensor-parallel regions (the residual stream: layer norms, dropouts, residual adds) every
tp rank computes and saves the same replicated tensor.  Sequence parallelism splits those ops along
the sequence on the tp level instead: a region's entry becomes an all-gather (S(seq) -> R) and its
exit a reduce-scatter (Partial -> S(seq)) in place of the all-reduce; the ops and what they save
shrink by 1/tp.  The cost model prices exactly that from the strategies `sp_choice` returns
(costmodel/layouts.py reshards), no special case: SP is a choice of per-op dims on the tp level, like
the regions themselves.  `sp_section` tells the emitter (sapp/emit/tp/sp.py) where each runtime piece
goes.  Pure Python over the OpGraph: no torch."""
from __future__ import annotations

SP_KINDS = ("elementwise", "dropout", "norm")


def _cast(node) -> bool:
    """A dtype cast of the whole tensor (litgpt's RMSNorm: `x.float()` ... `.to(dtype=dtype)`): it
    runs on a sequence shard as it does on the whole."""
    return (node.kind == "view" and str(node.target) in _CASTS and len(node.operands) >= 1
            and tuple(node.operands[0].shape) == tuple(node.out.shape))


_CASTS = frozenset({"aten.to.dtype", "aten._to_copy.default", "aten.to.dtype_layout", "aten._to_copy"})


def _seq_dim(node):
    """The sequence dim of a row-split closer's output y[b, s, n]: its last leading dim that is not the
    batch (None for a 2-D [tokens, n] output: nothing to split along)."""
    lead = [d for d in node.out.dims[:-1]]
    dims = {d.name: d for d in node.dims}
    cand = [d for d in lead if d in dims and not dims[d].batch and dims[d].splittable]
    return cand[-1] if cand else None


def vocab_split(graph, choice: dict, tp: int) -> dict:
    """`choice` with every token embedding split by vocabulary on the tp level, as Megatron's sequence
    parallelism runs it (VocabParallelEmbedding, its partial sums reduce-scattered straight into the
    sequence shards: sapp/emit/tp/sp.py's `scatter` of a 'vocab' embedding).  The sharding search alone
    keeps a large table whole (it weighs time, and the lookup is cheaper unsplit), which leaves the
    table's weights, gradients and optimizer states on every tp rank: for the 1T GPT at t=8 about
    19 GB more on the first pipeline stage, which then holds one block fewer and pushes a third onto
    another stage (issue 29: SP + selective priced as slow as full recomputation).  A token lookup
    is one whose output has a batch dim (position tables are left alone); a table tied to another
    weight stays whole, as in `tp_layout.emittable`."""
    from .linears import nested_holders, param_uses
    tied = {p for p, k in param_uses(graph).items() if k > 1}
    nested = nested_holders(graph)             # a table with a norm inside: DTensor cannot split it
    out = dict(choice)
    for n, node in graph.nodes.items():
        if (node.kind != "embedding" or choice.get(n) is not None or not node.module or set(node.params) & tied
                or node.module in nested):
            continue
        v = next((d for d in node.dims if d.name == "v"), None)
        if v is not None and v.splittable and v.size % tp == 0 and any(d.batch for d in node.dims):
            out[n] = "v"
    return out


def sp_with_table(graph, choice: dict, tp: int):
    """(strategies, sp_section) of sequence parallelism on `choice` (one tp level): with the token table
    split by vocabulary where the emitter can place that (`vocab_split`), else with the table as the
    search left it (an HF decoder's `embed_tokens`, cut at the first block, must stay whole)."""
    from .linears import tied_tables
    whole = dict(choice)
    for _, embs, heads in tied_tables(graph):
        whole.update({n: None for n in list(embs) + list(heads)})
    # last, a table tied to the head left whole, head too: split by vocabulary, nanoGPT's `wte(idx) +
    # wpe(pos)` summed in the model could not be cut where the first block takes the stream in
    bases = [vocab_split(graph, choice, tp), choice] + ([whole] if whole != choice else [])
    first = None
    for base in bases:
        with_sp = sp_choice(graph, base, tp)
        sec = sp_section(graph, {n: (d,) for n, d in with_sp.items()}, 0, tp) or {}
        if not sec.get("unsupported"):
            return with_sp, sec
        first = first if base is not choice else (with_sp, sec)
    return first


def sp_choice(graph, choice: dict, tp: int) -> dict:
    """`choice` ({node: tp dim or None}, e.g. from `emittable`) with sequence parallelism added: from
    the output of every row-split closer (a linear on `k`), the sequence axis is followed forward and
    backward through element-wise ops, dropouts and norms that no region holds (the residual stream,
    the embedding's sum and dropout, the final norm) up to the next regions' openers and anything else
    (embeddings, the head, the loss), which stay as they are and meet the split through resharding.
    An op joins only if that axis is a splittable, non-batch dim dividing by tp, it is not a model
    output, and it does not meet the axis on a different dim from another joined op."""
    from .linears import linears
    out = dict(choice)
    lin = set(linears(graph))
    consumers = graph.consumers()
    assigned = {}
    scattered = set()
    stack = []
    for n, d in choice.items():
        if n in lin and d == "k":
            sd = _seq_dim(graph.nodes[n])
            if sd is not None:
                stack.append((n, sd, "seed"))
    free = {n for n, node in graph.nodes.items()
            if (node.kind in SP_KINDS or _cast(node)) and choice.get(n) is None and n not in graph.outputs}
    def ok(name, d):
        node = graph.nodes[name]
        dim = next((x for x in node.dims if x.name == d), None)
        return dim is not None and dim.splittable and not dim.batch and dim.size % tp == 0

    # a template graph (sapp.pipeline.profile) cuts the blocks it leaves out: the epilogue's first op
    # (the final norm) then reads the residual stream as an input without producer; it joins like the
    # same op after a kept block would
    for n in sorted(free, key=list(graph.nodes).index):
        node = graph.nodes[n]
        cut = [op for op in node.operands if op.producer is None and op.param is None and len(op.dims) >= 3]
        sd = _seq_dim(node) if cut and len(cut[0].dims) == len(node.out.dims) else None
        if sd is not None and sd in cut[0].dims and ok(n, sd):
            stack.append((n, sd, "cut"))
            assigned[n] = sd

    while stack:
        name, d, _ = stack.pop()
        node = graph.nodes[name]
        axis = node.out.dims.index(d) if d in node.out.dims else None
        # forward: consumers see this axis through their operand's dims
        if axis is not None:
            for c, j in consumers[name]:
                if c not in free:
                    continue
                op = graph.nodes[c].operands[j]
                cd = op.dims[axis] if axis < len(op.dims) else None
                if cd is None or not ok(c, cd) or assigned.get(c, cd) != cd:
                    continue
                if c not in assigned:
                    assigned[c] = cd
                    stack.append((c, cd, "fwd"))
        # backward: producers of a joined op's operands that carry the same dim
        if name in assigned:
            for op in node.operands:
                q = op.producer
                if q is None or d not in op.dims:
                    continue
                qa = op.dims.index(d)
                qn = graph.nodes[q]
                if qa >= len(qn.out.dims) or len(op.dims) != len(qn.out.dims):
                    continue            # a broadcast operand: sliced locally, no need to split its producer
                qd = qn.out.dims[qa]
                if q not in free:
                    # an embedding (or other producer that stays whole) scattered to sequence shards: its
                    # other readers (a first layer norm) take the shard as well
                    if qn.kind in ("embedding", "matmul") and (q, qd) not in scattered:
                        scattered.add((q, qd))
                        stack.append((q, qd, "scatter"))
                    continue
                if not ok(q, qd) or assigned.get(q, qd) != qd:
                    continue
                if q not in assigned:
                    assigned[q] = qd
                    stack.append((q, qd, "bwd"))
    out.update(assigned)
    return out


def sp_nodes(graph, strategies: dict, tp_level, tp: int) -> set:
    """Nodes running sequence-parallel under full-graph `strategies` (tp level `tp_level`): those
    `sp_choice` would add to the regions (the SP kinds cleared first), split exactly that way."""
    if tp_level is None or tp <= 1:
        return set()

    def dim(n):
        s = strategies.get(n) or ()
        return s[tp_level] if tp_level < len(s) else None
    base = {n: (None if graph.nodes[n].kind in SP_KINDS or _cast(graph.nodes[n]) else dim(n)) for n in graph.nodes}
    want = sp_choice(graph, base, tp)
    return {n for n, d in want.items() if d is not None and base[n] is None and dim(n) == d}


def _enclosing(module: str, outside) -> str:
    """The outermost ancestor of `module` (itself included) that contains none of the `outside` modules
    (the sequence-split producer and its other sequence-split readers): where the input can be gathered
    before any op of that module reads its shape, while they still see the shard."""
    parts = module.split(".")
    best = module
    for i in range(len(parts) - 1, 0, -1):
        anc = ".".join(parts[:i])
        if any(o == anc or o.startswith(anc + ".") for o in outside):
            break
        best = anc
    return best


def _block_entry(graph, p, block, sp, consumers) -> bool:
    """Whether `p`'s output can be cut to sequence shards on entry to `block`: every reader inside the
    block runs sequence-parallel, and `p` lies outside it (readers outside keep the whole tensor)."""
    if not block or graph.nodes[p].block == block:
        return False
    inside = [c for c, _ in consumers[p] if graph.nodes[c].block == block]
    return bool(inside) and all(c in sp for c in inside)


def _runs_blocks(module: str, blocks) -> bool:
    """Whether `module` (qualname, "" = the model) holds repeated blocks below it."""
    return any(not module or b.startswith(module + ".") for b in blocks)


def _builds_for_blocks(graph, runner: str, skip: str, consumers):
    """A node of `runner`'s (outside its blocks and outside the module `skip`) that a block reads
    and that reads nothing a block made: a mask or positions the model builds from the sequence
    length before the blocks (XLM-RoBERTa-XL's causal mask, made from the embeddings' output shape).
    Its name, or None."""
    for n, node in graph.nodes.items():
        m = node.module or ""
        if node.block or node.kind == "input" or (runner and not (m == runner or m.startswith(runner + "."))):
            continue
        if m == skip or m.startswith(skip + "."):
            continue
        if any(graph.nodes[o.producer].block for o in node.operands if o.producer):
            continue
        if any(graph.nodes[c].block for c, _ in consumers[n]):
            return n
    return None


def _cut_where_blocks_read_length(graph, sec, sp, dim, blocks, consumers):
    """Embeddings cut where their parent sums them (`scatter`) hand that parent's caller a shard; a
    caller that also runs the blocks and builds what they read from the length it sees (HF's masks)
    builds them for the shard (XLM-RoBERTa-XL tp2+sp: mask over 8 keys, scores over 16, at step 0).
    There the cut moves to where the first block takes the stream in (`block_scatter`, as for an HF
    decoder's embed_tokens): the sum runs whole on each rank (t times the few elementwise rows the
    plan prices at 1/t, as sp_entry's relayout does).  A vocabulary-split table cannot move (its
    partial sums are reduce-scattered into the cut): unsupported, so the search keeps the table whole.
    Models with a sequence-parallel norm before the blocks are left to sp_entry.relayout (BERT)."""
    order = list(graph.nodes)
    first = next((i for i, n in enumerate(order) if graph.nodes[n].block), len(order))
    if not sec["scatter"] or any(graph.nodes[order[i]].kind == "norm" and order[i] in sp for i in range(first)):
        return
    mods = set(sec["scatter"])
    prods = [n for n, node in graph.nodes.items() if node.module in mods and node.kind in ("embedding", "matmul")
             and n not in sp]
    summing = {graph.nodes[p].module.rpartition(".")[0] for p in prods}
    runners = {}
    for m in summing:
        anc = m
        while anc:
            anc = anc.rpartition(".")[0]
            if _runs_blocks(anc, blocks):
                runners[m] = anc
                break
    hit = next(((m, b) for m, r in sorted(runners.items()) if (b := _builds_for_blocks(graph, r, m, consumers))), None)
    if hit is None:
        return
    if any(dim(p) == "v" for p in prods):
        sec["unsupported"].append(f"{hit[1]} ({graph.nodes[hit[1]].module or 'the model'}) is built from the length of "
                                  f"{hit[0]}'s output for the blocks; a vocabulary-split table cannot be cut at the blocks")
        return
    # follow the sequence-parallel ops outside the blocks from the tables to the first block's entry
    seen, stack, entries = set(prods), list(prods), set()
    while stack:
        x = stack.pop()
        for c, _ in consumers[x]:
            cn = graph.nodes[c]
            if cn.block and x not in prods:
                entries.add((x, cn.block))
            elif c in sp and not cn.block and c not in seen:
                seen.add(c)
                stack.append(c)
    blocks_in = {b for _, b in entries}
    if len(blocks_in) != 1 or not all(_block_entry(graph, x, b, sp, consumers) for x, b in entries):
        sec["unsupported"].append(f"{hit[1]} ({graph.nodes[hit[1]].module or 'the model'}) is built from the length of "
                                  f"{hit[0]}'s output for the blocks, and the stream enters them in more than one place")
        return
    x, b = next(iter(entries))
    sec["block_scatter"][b] = graph.nodes[x].out.dims.index(dim(x))
    sec["scatter"] = {}


def sp_section(graph, strategies: dict, tp_level, tp: int, sp=None) -> dict:
    """Where the emitter puts each runtime piece of sequence parallelism ({} when none runs), axes
    counted in the module's own tensor:
      norms    {module: seq axis}  SequenceParallel: replicated weights, input and output sequence shards
      entries  {module: seq axis}  the input arrives as a sequence shard and is all-gathered before the
                                   module runs (a region's attention/MLP module, or a lone / replicated
                                   linear such as the LM head): PrepareModuleInput, or ColwiseParallel's
                                   input layout on a lone linear; its saved copy is re-gathered in backward
      exits    {module: seq axis}  a row-split closer reduce-scatters to sequence shards
      scatter  {module: seq axis}  a replicated (or vocabulary-split) producer's output is cut to this
                                   rank's sequence shard (embeddings)
      block_scatter {block: seq axis}  a replicated producer whose parent module also reads it whole (an
                                   HF decoder's embed_tokens) is cut to the shard where the first block
                                   takes it in (its activation input)
      unsupported [why, ...]       edges the emitter cannot place (emit refuses such a plan)
    `sp`: sp_nodes(graph, strategies, tp_level, tp) when the caller has it already."""
    sp = sp_nodes(graph, strategies, tp_level, tp) if sp is None else sp
    if not sp:
        return {}
    sec = {"norms": {}, "entries": {}, "exits": {}, "scatter": {}, "block_scatter": {}, "unsupported": []}

    def dim(n):
        s = strategies.get(n) or ()
        return s[tp_level] if tp_level < len(s) else None
    consumers = graph.consumers()
    blocks = {node.block for node in graph.nodes.values() if node.block}
    for n in graph.nodes:
        if n not in sp:
            continue
        node = graph.nodes[n]
        d = dim(n)
        if node.kind == "norm" and node.module:
            sec["norms"][node.module] = node.out.dims.index(d)
        _into_split(graph, sec, n, d, sp, dim, blocks, consumers)
        _out_of_split(graph, sec, n, d, sp, dim, blocks, consumers)
    _cut_where_blocks_read_length(graph, sec, sp, dim, blocks, consumers)
    _shard_readers(graph, sec, sp, consumers)
    sec["unsupported"] = sorted(set(sec["unsupported"]))
    return {k: (dict(sorted(v.items())) if isinstance(v, dict) else v) for k, v in sec.items()}


def _into_split(graph, sec, n, d, sp, dim, blocks, consumers) -> None:
    """Where SP node n's operands from outside the SP set (split along d) come from: a row-split
    closer's exit, an embedding's scatter or block_scatter, or an edge the emitter cannot place."""
    node = graph.nodes[n]
    for op in node.operands:
        p = op.producer
        if p is None or p in sp or d not in op.dims or graph.nodes[p].kind == "input":
            continue
        pn, axis = graph.nodes[p], op.dims.index(d)
        if axis >= len(pn.out.dims) or not pn.module:
            sec["unsupported"].append(f"{n} reads {p} without a module boundary")
        elif dim(p) == "k":
            sec["exits"][pn.module] = axis
        elif dim(p) in (None, "v") and pn.kind in ("embedding", "matmul") and (
                node.module == pn.module.rpartition(".")[0]) and _runs_blocks(node.module, blocks):
            # the parent sums it but also runs the blocks (Granite's `embed_tokens(ids) * multiplier`
            # in the decoder model): it reads the cut length for positions and masks, and the blocks'
            # first input is not where the cut would be
            sec["unsupported"].append(f"{n} ({node.module or 'the model'}) works on {p}'s output in a module that "
                                      f"also runs the blocks")
        elif dim(p) in (None, "v") and pn.kind in ("embedding", "matmul") and (
                node.module == pn.module.rpartition(".")[0]):
            # cut right where the producer's parent sums it (GPT's Embed): a parent further out (an HF
            # model's embed_tokens -> layers) may read the full length from it (masks, positions)
            sec["scatter"][pn.module] = axis
        elif dim(p) is None and pn.kind in ("embedding", "matmul") and _block_entry(graph, p, node.block, sp,
                                                                                      consumers):
            # an HF decoder's embedding: its parent reads the full length (masks, positions), so the
            # residual stream is cut where the first block takes it in
            sec["block_scatter"][node.block] = axis
        elif pn.kind in ("embedding", "matmul") and dim(p) is None and (
                cut := _entry_cut(graph, n, sp, dim, consumers)):
            # summed further out than its parent (nanoGPT's `wte(idx) + wpe(pos)` in the model): that sum
            # runs whole on each rank and the stream is cut where the one block taking it in does
            sec["block_scatter"].update([cut])
        elif pn.kind in ("embedding", "matmul") and dim(p) in (None, "v"):
            sec["unsupported"].append(f"{n} ({node.module}) sums {p}'s output outside its parent module")
        else:
            sec["unsupported"].append(f"{p} ({pn.kind}) feeds the sequence split of {n}")


def _entry_cut(graph, n, sp, dim, consumers):
    """(block, seq axis) where the sequence-parallel ops outside the blocks that follow `n` (the sum
    of embeddings and its dropout) hand the stream to one block whose readers all run
    sequence-parallel; None when `n` is in a block, the stream enters in more than one place, or a norm
    runs on the way (the emitter runs a norm's module sequence-parallel: it would take the whole as a shard)."""
    if graph.nodes[n].block or graph.nodes[n].kind == "norm":
        return None
    seen, stack, entries = {n}, [n], set()
    while stack:
        x = stack.pop()
        for c, _ in consumers[x]:
            cn = graph.nodes[c]
            if cn.block:
                entries.add((x, cn.block))
            elif c in sp and c not in seen:
                if cn.kind == "norm":
                    return None         # its module would run sequence-parallel on the whole (Bloom's
                seen.add(c)             # word_embeddings_layernorm): not a cut at the block
                stack.append(c)
            elif c not in sp:
                return None
    if len({b for _, b in entries}) != 1 or not all(_block_entry(graph, x, b, sp, consumers) for x, b in entries):
        return None
    x, b = next(iter(entries))
    return b, graph.nodes[x].out.dims.index(dim(x))


def _out_of_split(graph, sec, n, d, sp, dim, blocks, consumers) -> None:
    """Where SP node n's output (split along d) leaves the SP set: a region module's entry
    all-gather, or a reader the emitter cannot place."""
    node = graph.nodes[n]
    axis = node.out.dims.index(d)
    for c, j in consumers[n]:
        if c in sp:
            continue
        cn = graph.nodes[c]
        if cn.kind == "matmul" and cn.module and dim(c) in ("n", None) and any(
                o.param is not None for o in cn.operands):
            others = [graph.nodes[x].module or "" for x, _ in consumers[n] if x in sp]
            where = _enclosing(cn.module, [node.module or ""] + others)
            if any(b.startswith(where + ".") for b in blocks):
                # an encoder-decoder's decoder reading the encoder's output: its gather could not
                # tell that input from the others (sapp/emit/tp/sp_entry.check_entries refuses it), so
                # sequence parallelism is not priced here and tp runs without it
                sec["unsupported"].append(f"{where} holds a stack of blocks and reads the sequence split of {n}")
                continue
            sec["entries"].setdefault(where, axis)
        else:
            sec["unsupported"].append(f"{c} ({cn.kind}) reads the sequence split of {n}")


def _shard_readers(graph, sec, sp, consumers) -> None:
    """A scattered or reduce-scattered output is the shard for every reader: each must take the shard."""
    owner = {graph.nodes[n].module: n for n in graph.nodes if graph.nodes[n].module}
    # each module's first embedding / linear outside the SP set, found in one pass (not one per module)
    opener = {}
    for n, node in graph.nodes.items():
        if node.module and n not in sp and node.kind in ("embedding", "matmul"):
            opener.setdefault(node.module, n)
    for key in ("exits", "scatter"):
        for mod in sec[key]:
            p = opener.get(mod, owner.get(mod))
            for c, _ in consumers.get(p, ()):
                cn = graph.nodes[c]
                if c not in sp and not (cn.kind == "matmul" and any(o.param is not None for o in cn.operands)):
                    sec["unsupported"].append(f"{c} ({cn.kind}) reads {p} whole, which runs sequence-sharded")
