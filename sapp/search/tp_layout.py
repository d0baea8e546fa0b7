"""Tensor-parallel layouts derived from the operator graph, in the one form DTensor runs.

The sharding search may cut a linear's out features (`n`: column split) or its contraction (`k`: row
split) anywhere.  DTensor's ColwiseParallel / RowwiseParallel run one form: a *region* that opens with
column-split linears (q/k/v, gate/up) and closes with row-split ones (o_proj, down), every op between
them working on whole shards of the split features (views to heads, rotary, attention over heads,
activations), one all-reduce at the closer.  The search's own pick can be another, equally priced form
(at 7B dims, Llama's q/k/v split by rows and o_proj by columns around a hidden-sharded residual), which
DTensor's sharding propagation cannot run.  So the tp level's strategies pass through `emittable`:

1. regions are found on the graph, not by module names: from each weight-holding linear, follow its
   consumers through ops without weights until the next linears (the closers); openers that reach
   the same ops form one region;
2. a region is *valid* when the split can be carried op by op: the op dim each op runs over the split
   axis (from the IR's operand dims) is splittable, divides by tp, is not contracted before a closer,
   meets no other operand that also has it (a replicated bias over heads, T5's position bias), and
   reaches a closer's contraction `k`.  A split / chunk cutting the split axis into pieces (a fused
   q/k/v or gate/up projection) passes when every piece divides by tp: the opener is then split by
   pieces (`fused_parts`; emit orders its rows so each rank holds its share of every piece);
3. a valid region is sharded when the search cut a weight in it (it judged tensor parallelism to pay
   there); its ops get exactly the per-op dims of step 2, everything else is replicated on the tp
   level.  A lone column-split linear (the LM head) is kept with its output gathered; an embedding
   table tied to the head is split by vocabulary in both uses (`linears.tied_tables`), as Megatron does.

The joint search prices these strategies (sapp.api passes `search_fn` below), so the plan's predicted
time is that of the program emit runs, and a tp degree that shards nothing is priced as the
replication it is.  Pure Python over the OpGraph: no torch."""
from __future__ import annotations

from dataclasses import dataclass, field

from .linears import linears, lookup_tail, nested_holders, param_uses, tied_tables  # noqa: F401  (linears: read from here too)
from .sp_layout import sp_with_table
from . import tp_fold, tp_mha
from .tp_fused import fused_openers, fused_parts, piece_cut  # noqa: F401  (read from here)
from .tp_regroup import into_batch, regroup, regroup_parts
from .tp_sliced import broadcast, sliceable


@dataclass
class Region:
    openers: list                 # node names of column-split linears
    closers: list                 # node names of row-split linears
    dims: dict = field(default_factory=dict)   # node -> op dim split on the tp level (members too)
    parts: dict = field(default_factory=dict)  # fused opener node -> its pieces' sizes (split by heads)
    sliced: dict = field(default_factory=dict)  # node -> operand indices made outside, sliced to a rank's part
    bcast: dict = field(default_factory=dict)   # expand made outside -> its axis over the split (a rank's share)
    members: set = field(default_factory=set)   # ops between the openers and the closers
    folds: dict = field(default_factory=dict)   # node -> (outer, heads, inner) of a batch its heads ride (tp_fold.py)
    why: str = ""                 # why it is not valid ("" when valid)


def _members(graph, consumers, start, is_linear):
    """Nodes reached from `start`'s output through ops without weights, and the linears met."""
    seen, closers, stack = set(), set(), [start]
    while stack:
        cur = stack.pop()
        for c, _ in consumers[cur]:
            if c in seen or c in closers:
                continue
            if is_linear(c):
                closers.add(c)
            else:
                seen.add(c)
                stack.append(c)
    return seen, closers


def _operand_dims(graph, name, dims: dict, folds: dict, inside: set) -> tuple:
    """(op dims `name` meets the split on, the fold its output carries or None, whether it splits a
    fold back, why not '') from its operands made inside the region."""
    node = graph.nodes[name]
    got, fold, unfolded = set(), None, False
    for op in node.operands:
        if op.producer not in inside:
            continue
        p = graph.nodes[op.producer]
        pd = dims.get(op.producer)
        if pd is None or pd not in p.out.dims:
            return got, None, False, f"{op.producer} contracts the split before reaching a closer"
        axis = p.out.dims.index(pd)
        d = op.dims[axis] if axis < len(op.dims) else None
        if op.producer in folds:                # the split rides a merged batch axis (tp_fold.py)
            d, f, why = tp_fold.follow(node, op, axis, folds[op.producer])
            if why or (f is not None and fold not in (None, f)):
                return got, None, False, why or f"{name} meets heads folded into the batch at two sizes"
            fold, unfolded = f or fold, unfolded or f is None
            got.add(d)
            continue
        if d is None and not any(op.dims):
            continue                # read for its shape only (expand_as's `other`): the audit checks it
        if d is None and (rg := regroup(node, op, axis)) is not None:
            d = rg[0]                           # key heads repeated as the inner factor (tp_regroup.py)
        if d is None and (fd := tp_fold.into(node, op, axis)) is not None:
            d, fold = fd                        # heads folded into the data batch (tp_fold.py)
        if d is None and into_batch(node, op, axis):
            return got, None, False, f"{name} folds the split heads into the data batch at other sizes"
        if d is None:
            return got, None, False, f"{name} ({node.kind}) does not map the split axis of {op.producer}"
        got.add(d)
    if fold is not None and unfolded:
        return got, None, False, f"{name} meets heads folded into the batch and heads split back out"
    return got, fold, unfolded, ""


def _propagate(graph, consumers, region: Region, members: set, tp: int) -> str:
    """Assign each member the op dim it runs over the split axis; '' when consistent, else why not."""
    dims = {o: "n" for o in region.openers}
    order = [n for n in graph.nodes if n in members or n in region.closers]
    inside = set(region.openers) | members
    sliced, bcast, folds = {}, {}, {}
    for name in order:
        node = graph.nodes[name]
        got, fold, unfolded, why = _operand_dims(graph, name, dims, folds, inside)
        if why or not got:
            return why or f"{name} ({node.kind}) reads the split only for its shape"
        if len(got) != 1:
            return f"{name} meets the split on different dims {sorted(got)}"
        d = got.pop()
        if name in region.closers:
            if d != "k":
                return f"closer {name} meets the split on {d}, not its contraction k"
            dims[name] = d
            continue
        if fold is not None:        # rows of a merged batch: a rank's heads' rows (tp_fold.py)
            folds[name] = fold
            dim = next((x for x in node.dims if x.name == d), None)
            if fold[1] % tp or dim is None or not dim.splittable:
                return f"{name} ({node.kind}) cannot split the {fold[1]} heads folded into its batch {tp} ways"
            for op in node.operands:
                why = "" if op.producer in inside else tp_fold.outside_reads(node, op, d)
                if why:
                    return why
            if name in graph.outputs:
                return f"{name} is a model output"
            dims[name] = d
            continue
        dim = next((x for x in node.dims if x.name == d), None)
        piece = piece_cut(node, d)
        if piece is not None:                   # a fused projection's piece, split by heads
            if any(v % tp for v in piece["sizes"]):
                return f"{name} ({node.kind}) cuts the fused split axis into {piece['sizes']}, not all divisible by {tp}"
        elif dim is None or not (dim.splittable or unfolded) or dim.batch or dim.size % tp:
            return f"{name} ({node.kind}) cannot split {d} {tp} ways"
        for j, op in enumerate(node.operands):
            if op.producer not in inside and d in op.dims and op.numel > 1:
                why = sliceable(graph, node, op, d, inside)
                if why:
                    src = op.param or op.producer or "an input"
                    return f"{name} combines the split with {src}, which runs over the same dim unsplit ({why})"
                if broadcast(graph, op, op.dims.index(d)):     # the same values on every head
                    bcast[op.producer] = op.dims.index(d)
                else:
                    sliced.setdefault(name, []).append(j)
        if name in graph.outputs:
            return f"{name} is a model output"
        dims[name] = d
    region.dims, region.sliced, region.bcast, region.folds = dims, sliced, bcast, folds
    parts, why = fused_parts(graph, dims, consumers)
    heads, why2 = regroup_parts(graph, dims, set(linears(graph)), tp, folds)
    if set(parts) & set(heads):
        why2 = f"{sorted(set(parts) & set(heads))[0]} is both a fused projection and the queries of repeated key heads"
    elif heads and sliced:      # a rank's query heads are then not one block of the bias's heads
        why2 = f"{sorted(sliced)[0]} adds a per-head tensor to query heads held in the repeated key heads' order"
    region.parts = {**parts, **heads}
    return why or why2


def regions(graph, tp: int, gather=frozenset(), mha: bool = True) -> list:
    """Every region of the graph (valid or not, `why` says), openers in graph order.  `gather`:
    module patterns (`gathered`) whose regions stay replicated: sapp/emit/runnable.py found that block
    cannot run at one rank's shapes (it reshapes by sizes fixed for the whole model).  nn.MultiheadAttention
    modules are regions of their own (tp_mha.py), not split when `mha` is false (sequence parallelism)."""
    lin = set(linears(graph))
    consumers = graph.consumers()
    reach = {}
    ends = lin | set(tp_mha.holders(graph))        # nn.MultiheadAttention's projections end a region too
    for name in graph.nodes:
        if name in lin:
            reach[name] = _members(graph, consumers, name, ends.__contains__)
    # openers whose reached ops overlap form one region (q, k and v meet in the attention)
    groups = []
    for o in (n for n in graph.nodes if n in lin):
        mem, clo = reach[o]
        hit = [g for g in groups if g["members"] & mem or g["closers"] & clo]
        merged = {"openers": [o], "members": set(mem), "closers": set(clo)}
        for g in hit:
            merged["openers"] = g["openers"] + merged["openers"]
            merged["members"] |= g["members"]
            merged["closers"] |= g["closers"]
            groups.remove(g)
        groups.append(merged)
    out = []
    order = {n: i for i, n in enumerate(graph.nodes)}
    for g in sorted(groups, key=lambda g: order[g["openers"][0]]):
        r = Region(sorted(g["openers"], key=order.get), sorted(g["closers"], key=order.get), members=g["members"])
        if not r.closers:
            r.why = "no row-split linear closes it"
        else:
            r.why = _propagate(graph, consumers, r, g["members"], tp)
        out.append(r)
    # a linear cannot be both: a closer of a region kept (in graph order) opens no other, and a region
    # dropped so keeps none of its closers (DynamicPositionBias's mlp.0 -> mlp.2 -> mlp.4 chain: the
    # first and the attention mlp.4 opens are kept, the one between is not)
    closing = set()
    for r in out:
        if not r.why and closing & set(r.openers):
            r.why = f"{sorted(closing & set(r.openers))[0]} already closes another region"
        if not r.why:
            closing |= set(r.closers)
    for r in tp_mha.regions(graph, tp, Region):
        if not r.why and not mha:
            r.why = (f"{graph.nodes[r.openers[0]].module} is split by heads without sequence parallelism only "
                     f"(its own forward gathers no sequence)")
        out.append(r)
    out.sort(key=lambda r: order[(r.openers + r.closers)[0]])
    if gather:
        for r in out:
            hit = next((graph.nodes[n].module for n in r.openers + r.closers
                        if gathered(graph.nodes[n].module, gather)), None)
            if hit is not None and not r.why:
                r.why = f"gathered: {hit} cannot run at one rank's shapes (the runnable check's note says why)"
    return out


def unsplit_attention(graph, tp: int, styles: dict) -> list:
    """One line per attention (a softmax or an SDPA op, by module pattern) that a plan's tp_modules
    `styles` leaves replicated, saying why: the region it sits in and why that region is not split,
    or that no Linear tp splits makes its heads (nn.MultiheadAttention applies its packed
    in_proj_weight in its own forward)."""
    rs = regions(graph, tp)
    out = {}
    for n, node in graph.nodes.items():
        if node.kind not in ("attention", "softmax") or not node.module:
            continue
        r = next((r for r in rs if n in r.members), None)
        if r is not None and r.openers and all(styles.get(graph.nodes[o].module) in ("colwise", "heads")
                                               for o in r.openers):
            continue
        if r is None:
            why = "no Linear layer tp splits makes its queries and keys (a module applying its own weights)"
        elif not r.why:
            why = ("a region tp can split that this plan keeps whole (priced no faster split, or gathered by "
                   "the runnable check, whose note then says why)")
        else:
            why = r.why
        out.setdefault(gather_pattern(node.module), why)
    return [f"{m}: {w}" for m, w in sorted(out.items())]


def gather_pattern(module: str) -> str:
    """The pattern a gathered module is kept under: its path with list indices as `*`, so the rule
    found on one block holds for every block of the same list (the search prices one block's template,
    stamped on the others)."""
    return ".".join("*" if part.isdigit() else part for part in module.split("."))


def gathered(module: str, gather) -> bool:
    """Whether `module` is, or sits inside, a module matching one of the `gather` patterns."""
    if not module:
        return False
    parts = module.split(".")
    for pat in gather:
        pp = pat.split(".")
        if len(pp) <= len(parts) and all(a == "*" and b.isdigit() or a == b for a, b in zip(pp, parts)):
            return True
    return False


def emittable(graph, choice: dict, tp: int, gather=frozenset(), mha: bool = True):
    """(strategies for the tp level {node: dim or None}, [sharded Region], notes) from the search's
    `choice` ({node: dim or None}): valid regions where the search cut a weight, lone column-split
    linears the search chose (output gathered), vocab-split embeddings; the rest replicated.
    `gather`: module patterns kept replicated, `mha`: whether nn.MultiheadAttention is split (`regions`)."""
    out = {n: None for n in graph.nodes}
    used, notes = [], []
    lin = set(linears(graph))
    cut = {n for n, d in choice.items() if (n in lin or n in tp_mha.holders(graph)) and d in ("n", "k")}
    rs = [r for r in regions(graph, tp, gather, mha) if cut & (set(r.openers) | set(r.closers))]
    for r in rs:
        if not r.why:
            out.update(r.dims)
            used.append(r)
    # then the lone column splits, never over a linear a valid region already placed: AXK2's gate MLP
    # fc2 closes fc1's region (row split) and opens an invalid one (its output meets the unsplit norm)
    for r in rs:
        if not r.why:
            continue
        n_dim = next((d for d in graph.nodes[r.openers[0]].dims if d.name == "n"), None) if r.openers else None
        # a lone column split needs its output width to divide evenly: FT-Transformer's 1-wide head
        # split 2 ways left one rank no row, and its gradient came back replicated (Adam's lerp_ refused)
        if (len(r.openers) == 1 and r.openers[0] in lin and choice.get(r.openers[0]) == "n" and out[r.openers[0]] is None
                and not r.why.startswith("gathered") and n_dim is not None and n_dim.splittable
                and n_dim.size % tp == 0):
            out[r.openers[0]] = "n"             # e.g. the LM head: column split, output gathered
            used.append(Region([r.openers[0]], [], {r.openers[0]: "n"}))
        else:
            notes.append(f"tp layout: {graph.nodes[(r.openers + r.closers)[0]].module} .. stays replicated ({r.why})")
    tied = {p for p, k in param_uses(graph).items() if k > 1}
    nested = nested_holders(graph)
    tails = {n: lookup_tail(graph, n) for n, node in graph.nodes.items() if node.kind == "embedding" and node.module}
    for n, why in sorted(tails.items()):
        if why and (choice.get(n) == "v" or any(n in embs for _, embs, _ in tied_tables(graph))):
            notes.append(f"tp layout: {graph.nodes[n].module} stays replicated (its own forward applies {why} to the "
                         f"looked-up rows, which a vocabulary split leaves summed over tp)")
    for n, node in graph.nodes.items():
        if (node.kind == "embedding" and choice.get(n) == "v" and node.module and not (set(node.params) & tied)
                and node.module not in nested and not tails.get(n)):
            dim = next((d for d in node.dims if d.name == "v"), None)
            if dim is not None and dim.size % tp == 0:
                out[n] = "v"
    # a table tied to an output head is split by vocabulary in every use or in none (one weight);
    # the search judged it to pay when it cut either use
    for _, embs, heads in tied_tables(graph):
        if any(choice.get(e) == "v" for e in embs) or any(choice.get(h) == "n" for h in heads):
            if _tied_divides(graph, embs, tp) and not any(tails.get(e) for e in embs):
                out.update({e: "v" for e in embs})
                out.update({h: "n" for h in heads})
    return out, used, notes


def _tied_divides(graph, embs, tp: int) -> bool:
    dims = [next((d for d in graph.nodes[e].dims if d.name == "v"), None) for e in embs]
    return all(d is not None and d.splittable and d.size % tp == 0 for d in dims)


class _Result:
    def __init__(self, strategies, method, base):
        self.strategies, self.method = strategies, method
        self.cost = getattr(base, "cost", None)
        self.feasible = getattr(base, "feasible", True)
        self.memory_bytes = getattr(base, "memory_bytes", 0.0)
        self.search_s = getattr(base, "search_s", 0.0)


def gathering(gather: dict):
    """`search_fn` with the regions of `gather` ({tp: module patterns}) kept replicated at that tp."""
    import functools
    return functools.partial(search_fn, gather=gather)


def search_fn(graph, mesh, cluster, settings, level_roles=None, sp=False, gather=None, **kw):
    """The joint search's tp-level search: sapp's sharding search, then `emittable` (one tp level),
    then, when `sp`, sequence parallelism over the ops between the regions (`sp_choice`).  `gather`:
    {tp: module patterns} whose regions stay replicated at that degree (`gathering`)."""
    from .api import shard_search
    res = shard_search(graph, mesh, cluster, settings, level_roles=level_roles, **kw)
    if len(mesh.levels) != 1:
        return res
    tp = mesh.levels[0].size
    g = frozenset((gather or {}).get(tp, ()))
    choice = {n: tuple(s)[0] for n, s in res.strategies.items()}
    strategies, _, _ = emittable(graph, choice, tp, g, mha=not sp)
    method = f"{res.method}+emittable"
    # The search's pick may be a form DTensor cannot run at all: at long sequences it splits every op
    # along the sequence on the tp level (context parallelism in disguise, weights replicated), which
    # `emittable` turns into plain replication - slower than any region split.  So the layout that
    # shards every valid region (Megatron's) is priced beside it and the faster of the two is kept.
    # Megatron's layout also splits the output layer (the LM head: a lone column split, its output
    # gathered here); the search's sequence-split pick does not cut it, so without it every tp rank
    # computed the whole vocabulary's head (Llama-3-405B at 131072 tokens: ~2 blocks' time on the last
    # stage).  Both variants are priced: at tiny widths the gather can cost more than it saves.
    full = dict(choice)
    lone = {}
    for r in regions(graph, tp, g, mha=not sp):
        if not r.why:
            full.update({o: "n" for o in r.openers})
        elif len(r.openers) == 1 and not r.closers:
            lone[r.openers[0]] = "n"
    for _, embs, heads in tied_tables(graph):      # Megatron's vocab-parallel tied embedding and head
        lone.update({e: "v" for e in embs})
        lone.update({h: "n" for h in heads})
    alts = [emittable(graph, full, tp, g, not sp)[0]]
    if lone:
        alts.append(emittable(graph, {**full, **lone}, tp, g, not sp)[0])
    alts = [a for a in alts if a != strategies]
    if alts:
        from ..costmodel import evaluate_sharding

        def step(s):
            return evaluate_sharding(graph, {n: (d,) for n, d in s.items()}, mesh, cluster, settings).step_time_s
        best = step(strategies)
        for alt in alts:
            t = step(alt)
            if t < best:
                strategies, method, best = alt, f"{res.method}+regions", t
    if sp:
        strategies = sp_with_table(graph, strategies, tp)[0]
    return _Result({n: (d,) for n, d in strategies.items()}, method, res)


def modules(graph, strategies: dict, tp_levels: list, sp: set = frozenset()) -> tuple:
    """(tp_modules {module: style}, groups [[module, ...]], notes) of a full graph whose tp-level
    strategies came through `emittable`.  Styles: column-split linears feeding split ops 'colwise'
    (output stays sharded), lone ones 'colwise_gather', row-split 'rowwise', vocabulary-split
    embeddings 'vocab'.  A group is the linears of one region: emit shards all of them or none."""
    styles = {}
    consumers = graph.consumers()

    def tp_dim(n):
        s = strategies.get(n) or ()
        ds = {s[i] for i in tp_levels if i < len(s) and s[i] is not None}
        return ds.pop() if len(ds) == 1 else None

    # sequence-parallel ops (`sp`) join no region: they run between regions, whatever each region does
    split = {n for n in graph.nodes if tp_dim(n) is not None and n not in sp}
    lin = set(linears(graph))
    tied_heads = {h for _, _, heads in tied_tables(graph) for h in heads}
    mha = tp_mha.holders(graph)
    parent = {n: n for n in split}

    def find(n):
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in split:
        for c, _ in consumers[n]:
            if c in split and tp_dim(n) in graph.nodes[n].out.dims:    # the split flows on to c
                parent[find(c)] = find(n)
    for n, node in graph.nodes.items():
        d = tp_dim(n)
        if d is None or not node.module:
            continue
        if n in mha:                              # nn.MultiheadAttention split by heads (tp_mha.py)
            styles.setdefault(node.module, "heads")
        elif n in lin and d == "n":
            fed = any(c in split for c, _ in consumers[n])
            styles.setdefault(node.module, "colwise" if fed else "colwise_gather")
        elif n in lin and d == "k":
            styles.setdefault(node.module, "rowwise")
        elif node.kind == "embedding" and d == "v":
            styles.setdefault(node.module, "vocab")
        elif n in tied_heads and d == "n":        # the head of a vocabulary-split tied table
            styles.setdefault(node.module, "colwise_gather")
    by_root = {}
    for n in graph.nodes:
        node = graph.nodes[n]
        if n in split and node.module in styles:
            mods = by_root.setdefault(find(n), [])
            if node.module not in mods:
                mods.append(node.module)
    groups = sorted(g for i, g in enumerate(by_root.values()) if g not in list(by_root.values())[:i])
    notes = []
    if tp_levels and not styles:
        notes.append("tensor parallelism shards nothing here: every tp rank computes the whole model "
                     "(priced as replication, no speed-up); pin tp=1 to use these devices for data parallelism")
    return styles, groups, notes


def module_parts(graph, strategies: dict, tp_levels: list, sp: set = frozenset(), tp: int = 0) -> dict:
    """{module: piece sizes} of the fused projections a layout splits by heads (the plan's
    `tp_layout.parts`): emit orders each such weight's rows so that a rank's share holds its share of
    every piece (sapp/emit/tp/fused.py).  `tp`: the degree, whose regions' heads folded into a batch
    (tp_fold.py) need no pieces where a repeat meets them."""
    dims = {}
    for n, s in strategies.items():
        ds = {s[i] for i in tp_levels if i < len(s or ()) and s[i] is not None}
        if len(ds) == 1 and n not in sp:
            dims[n] = ds.pop()
    parts, _ = fused_parts(graph, dims)
    folds = {n: f for r in (regions(graph, tp) if tp > 1 else []) if not r.why for n, f in r.folds.items()}
    parts.update(regroup_parts(graph, dims, set(linears(graph)), folds=folds)[0])
    return {graph.nodes[n].module: list(v) for n, v in sorted(parts.items()) if graph.nodes[n].module}
