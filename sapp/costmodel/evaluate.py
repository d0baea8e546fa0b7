"""Whole-graph cost of a sharding: totals, per node and per block."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SappError
from .dtypes import WIDTHS_KEY, ensure_widths
from .grads import GRAD_KEY
from .edges import edge_layouts, edge_times
from .memory import saved_items
from .nodes import node_cost


@dataclass
class ShardingCost:
    compute_s: float = 0.0          # forward + backward compute
    comm_s: float = 0.0             # reshard_s + grad_sync_s + param_comm_s
    reshard_s: float = 0.0          # activation / gradient resharding on edges (fwd + bwd)
    grad_sync_s: float = 0.0        # exposed gradient synchronisation
    param_comm_s: float = 0.0       # ZeRO-3 parameter gathers
    fwd_s: float = 0.0              # forward compute + forward resharding + forward param gathers
    bwd_s: float = 0.0              # backward compute + backward resharding + backward param gathers
    param_bytes: float = 0.0
    grad_bytes: float = 0.0
    optimizer_bytes: float = 0.0
    activation_bytes: float = 0.0
    per_node: dict = field(default_factory=dict)    # name -> dict of the node's share
    per_block: dict = field(default_factory=dict)   # block -> dict (same keys, summed)

    @property
    def step_time_s(self) -> float:
        return self.compute_s + self.comm_s

    @property
    def state_bytes(self) -> float:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def peak_memory_bytes(self) -> float:
        return self.state_bytes + self.activation_bytes

    @property
    def comm_by_kind(self) -> dict:
        return {"reshard": self.reshard_s, "grad_sync": self.grad_sync_s, "param": self.param_comm_s}


_KEYS = ("fwd_s", "bwd_s", "compute_s", "reshard_s", "grad_sync_s", "param_comm_s", "param_bytes",
         "grad_bytes", "optimizer_bytes", "activation_bytes")


def param_owners(graph) -> dict:
    """node name -> {param: trainable} for the params it accounts for (first user in topo order)."""
    seen, out = set(), {}
    for node in graph.nodes.values():
        mine = {}
        for p in node.params:
            if p not in seen:
                seen.add(p)
                info = graph.params.get(p)
                mine[p] = True if info is None else bool(info.trainable)
        out[node.name] = mine
    return out


def first_savers(graph, mesh, settings) -> dict:
    """tensor id -> the node that accounts for it (first saver in topological order)."""
    ensure_widths(graph)
    strat0 = (None,) * len(mesh.levels)
    out = {}
    for node in graph.nodes.values():
        for tid, _ in saved_items(node, strat0, mesh, settings):
            out.setdefault(tid, node.name)
    return out


def _sig(node):
    return (node.kind, node.dims, node.flops, node.bytes, node.out, node.saves, node.extra.get(WIDTHS_KEY),
            node.extra.get(GRAD_KEY),
            tuple((o.shape, o.dims, o.dtype, o.param is None, o.producer is None) for o in node.operands))


def check_strategies(graph, strategies, mesh):
    if not graph.nodes:
        raise SappError(f"graph {graph.name!r} has no operators; capture the model first")
    for name in graph.nodes:
        s = strategies.get(name)
        if s is None:
            raise SappError(f"no strategy for operator {name!r}; give one tuple per node")
        if len(s) != len(mesh.levels):
            raise SappError(f"strategy for {name!r} has {len(s)} entries but the mesh has {len(mesh.levels)} levels")


def _overlap_tp(graph, edges, gemms, per_node, mesh):
    """Take the seconds the tensor-parallel GEMMs hide off their neighbouring edges (booked on the
    consumer, as every edge is).  The ring has one chunk per rank of the levels the edge reshards:
    those where the two sides do not both split a batch dim (dim names are per node)."""
    from .tp_overlap import hide
    meta = {e[0]: (e[1], e[2], e[5], e[6]) for e in edges}     # edge -> (producer, consumer, their splits)

    def batchy(node, d):
        return d is None or any(x.name == d and x.batch for x in node.dims)

    def chunks(key):
        prod, cons, sp, s = meta[key]
        n = 1
        for lv, a, b in zip(mesh.levels, sp, s):
            if not (batchy(graph.nodes[prod], a) and batchy(graph.nodes[cons], b)) or (a is None) != (b is None):
                n *= lv.size
        return n
    for (name, _), (hf, hb) in hide([e[:5] for e in edges], gemms, chunks).items():
        d = per_node[name]
        d["fwd_s"] -= hf
        d["bwd_s"] -= hb
        d["reshard_s"] -= hf + hb


def _shared_entry(prod, node, operand, sp, s, f, bw, settings, shared):
    """One input read by several linears (HF's q/k/v, gate/up) moves once where the program moves it
    once.  Forward, a layout change (sequence parallelism's all-gather) happens at the region module's
    entry (emit/sp.py), before all of them; its backward then runs once on the summed gradients.  A
    replicated input's backward all-reduce is per linear under eager DTensor (each ColwiseParallel
    converts its own input) but once under the fused runtime (Megatron's fused QKV / FC1 reduce
    the input gradient once).  Shared inside one module only (the attention, the MLP): a tensor read
    by linears of several modules (an encoder output in every cross-attention) moves for each."""
    f_src, f_dst, b_src, b_dst = edge_layouts(prod, operand, sp, s, node)
    entry = f_src != f_dst
    where = node.module.rpartition(".")[0]
    key = (prod.name, where, f_src, f_dst, "fwd")
    if f > 0:
        if key in shared:
            f = 0.0
        shared.add(key)
    if bw > 0 and (entry or settings.fused):
        key = (prod.name, where, b_src, b_dst, "bwd")
        if key in shared:
            bw = 0.0
        shared.add(key)
    return f, bw


def memo_tables(memo, mesh, cluster, settings):
    """(node costs, edge times, saved items) kept in `memo` (a dict the caller holds for one graph,
    whose nodes do not change) for this mesh, cluster and settings: results of node_cost, edge_times
    and saved_items keyed by node names and strategies, shared by the evaluations of that graph."""
    key = ("cost", mesh, id(cluster), settings)
    got = memo.get(key)
    if got is None:
        got = memo[key] = ({}, {}, {}, cluster)      # (the cluster held: its id stays its own)
    return got[:3]


def _saved(table, node, s, mesh, settings):
    """saved_items(node, s, ...), looked up in `table` (memo_tables) when one is given."""
    if table is None:
        return saved_items(node, s, mesh, settings)
    got = table.get((node.name, s))
    if got is None:
        got = table[(node.name, s)] = saved_items(node, s, mesh, settings)
    return got


def evaluate_sharding(graph, strategies, mesh, cluster, settings, *, owners=None, savers=None,
                      activations=True, totals=True, memo=None) -> ShardingCost:
    """Additive cost: sum of node costs + edge resharding; memory = model states + saved activations
    per device.  Edge costs are booked to the consumer's node / block.  `owners` / `savers`: this
    graph's param_owners / first_savers(graph, mesh, settings) when the caller has them already.
    A stage profile reads only `per_node` and samples times at several batches: `activations` False
    leaves activation bytes at 0, `totals` False leaves the graph / block totals and the per-node
    sums (comm_s, time_s, memory_bytes) unset.  `memo`: a dict the caller keeps with this graph
    (memo_tables), for evaluations of it under other strategies on the same mesh: an operator or
    edge whose strategies an earlier evaluation priced is not priced again (the same call, the
    same numbers)."""
    check_strategies(graph, strategies, mesh)
    gnode, gedge, gsaved = memo_tables(memo, mesh, cluster, settings) if memo is not None else ({}, {}, None)
    ensure_widths(graph)        # (first_savers stamps them too; without activations it is not called)
    owners = param_owners(graph) if owners is None else owners
    if activations:
        savers = first_savers(graph, mesh, settings) if savers is None else savers
    per_node = {n: dict.fromkeys(_KEYS, 0.0) for n in graph.nodes}
    # Repeated blocks hold identical ops: price each (structure, strategy) once.
    node_memo, edge_memo = {}, {}
    sigs = _signatures(graph, memo)
    facts = _node_facts(graph, owners, memo)
    overlap = [] if settings.tp_overlap else None      # (runtime fused+tp-overlap: costmodel.tp_overlap)
    gemms = {}
    shared = set()          # (producer, module, src, dst, direction) moved for another linear (_shared_entry)
    for node in graph.nodes.values():
        s = tuple(strategies[node.name])
        own = owners[node.name]
        trainable, linear = facts[node.name]
        nkey = (sigs[node.name], s, trainable)
        c = node_memo.get(nkey)
        if c is None:
            gk = (node.name, s, nkey[2])
            c = gnode.get(gk)
            if c is None:
                c = gnode[gk] = node_cost(node, s, mesh, cluster, settings, params=own)
            node_memo[nkey] = c
        d = per_node[node.name]
        if overlap is not None and linear:
            gemms[node.name] = [c.fwd_s, c.bwd_s]
        d["fwd_s"] += c.fwd_s + c.fwd_comm_s
        d["bwd_s"] += c.bwd_s + c.bwd_comm_s
        d["compute_s"] += c.fwd_s + c.bwd_s
        d["grad_sync_s"] += c.grad_sync_s
        d["param_comm_s"] += c.fwd_comm_s + c.bwd_comm_s
        d["param_bytes"] += c.param_bytes
        d["grad_bytes"] += c.grad_bytes
        d["optimizer_bytes"] += c.optimizer_bytes
        for tid, b in _saved(gsaved, node, s, mesh, settings) if activations else ():
            if savers.get(tid) == node.name:
                d["activation_bytes"] += b
        for i, o in enumerate(node.operands):
            if o.producer is None:
                continue
            sp = tuple(strategies[o.producer])
            ekey = (sigs[o.producer], sigs[node.name], i, sp, s)
            fb = edge_memo.get(ekey)
            if fb is None:
                gk = (o.producer, node.name, i, sp, s)
                fb = gedge.get(gk)
                if fb is None:
                    fb = gedge[gk] = edge_times(graph.nodes[o.producer], o, sp, s, mesh, cluster, settings,
                                                consumer=node)
                edge_memo[ekey] = fb
            f, bw = fb
            if linear and f + bw > 0:
                f, bw = _shared_entry(graph.nodes[o.producer], node, o, sp, s, f, bw, settings, shared)
            d["fwd_s"] += f
            d["bwd_s"] += bw
            d["reshard_s"] += f + bw
            if overlap is not None and f + bw > 0:
                overlap.append(((node.name, i), o.producer, node.name, f, bw, sp, s))
    if overlap:
        _overlap_tp(graph, overlap, gemms, per_node, mesh)
    tot = ShardingCost(per_node=per_node)
    return _totals(graph, tot) if totals else tot


def _signatures(graph, memo) -> dict:
    """Each node's structure id (_sig: identical ops of repeated blocks share one), kept in `memo`."""
    sigs = memo.get("sigs") if memo is not None else None     # (the graph's nodes do not change)
    if sigs is None:
        sigs, ids = {}, {}
        for node in graph.nodes.values():
            sigs[node.name] = ids.setdefault(_sig(node), len(ids))
        if memo is not None:
            memo["sigs"] = sigs
    return sigs


def _node_facts(graph, owners, memo) -> dict:
    """Per node: its operands' trainable flags (the node-memo key) and whether it is a linear with
    parameters (_shared_entry), fixed for this graph and owners table (kept in `memo`)."""
    okey = ("node facts", id(owners))
    facts = memo.get(okey) if memo is not None else None
    if facts is None or facts[0] is not owners:
        facts = (owners, {n.name: (tuple(owners[n.name].get(o.param) for o in n.operands if o.param is not None),
                                   bool(n.kind == "matmul" and n.params)) for n in graph.nodes.values()})
        if memo is not None:
            memo[okey] = facts
    return facts[1]


def _totals(graph, tot) -> ShardingCost:
    """`tot` with the graph and per-block sums of its per-node costs, and each one's comm, time and
    memory totals."""
    per_node = tot.per_node
    for name, d in per_node.items():
        for k in _KEYS:
            setattr(tot, k, getattr(tot, k) + d[k])
        blk = graph.nodes[name].block
        if blk is not None:
            b = tot.per_block.setdefault(blk, dict.fromkeys(_KEYS, 0.0))
            for k in _KEYS:
                b[k] += d[k]
    tot.comm_s = tot.reshard_s + tot.grad_sync_s + tot.param_comm_s
    for d in list(per_node.values()) + list(tot.per_block.values()):
        d["comm_s"] = d["reshard_s"] + d["grad_sync_s"] + d["param_comm_s"]
        d["time_s"] = d["compute_s"] + d["comm_s"]
        d["memory_bytes"] = d["param_bytes"] + d["grad_bytes"] + d["optimizer_bytes"] + d["activation_bytes"]
    return tot
