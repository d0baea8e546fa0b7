"""The search problem in additive form: one variable per operator (identical repeated blocks share
the variables of their first block), a unary cost per strategy (compute + gradient sync + lambda x
memory, times how many ops share the variable) and a pairwise cost matrix per activation edge
(forward + backward resharding).  Every solver (recursive, exact, exhaustive) minimises this same
objective, so their results are directly comparable."""
from __future__ import annotations

import numpy as np

from ..costmodel.dtypes import WIDTHS_KEY, ensure_widths, out_bytes
from ..costmodel.edges import edge_layouts, fold_dst, fold_src, translate
from ..costmodel.layouts import input_grad_layout, input_layout, output_grad_layout, output_layout
from ..costmodel.evaluate import first_savers, param_owners
from ..costmodel.fp8 import edge_width
from ..costmodel.grads import GRAD_KEY, carries_grad
from ..costmodel.layouts import reshard_coeffs, reshard_time
from ..costmodel.memory import saved_items
from ..costmodel.nodes import node_cost, op_strategies
from ..errors import SappError

ROLES = ("dp", "tp", None)


def block_map(graph) -> dict:
    """node name -> representative node name, for blocks of a block group that really are identical
    (same kinds, iteration spaces and operand shapes by position); others map to themselves."""
    rep = {}
    for group in graph.block_groups:
        blocks = [b for b in group if b in graph.blocks]
        if len(blocks) < 2:
            continue
        first = graph.blocks[blocks[0]]
        sig0 = [_sig(graph.nodes[n]) for n in first]
        for b in blocks[1:]:
            names = graph.blocks[b]
            if len(names) != len(first) or any(_sig(graph.nodes[n]) != s for n, s in zip(names, sig0)):
                continue
            for n, r in zip(names, first):
                rep[n] = r
    return rep


def _sig(node):
    return (node.kind, node.dims, node.flops, node.saves, node.out.shape, node.out.dims, node.extra.get(WIDTHS_KEY),
            node.extra.get(GRAD_KEY),
            tuple((o.shape, o.dims, o.dtype, o.param is None, o.producer is None) for o in node.operands))


class Problem:
    def __init__(self, graph, mesh, cluster, settings, roles=None, share_blocks=True):
        if not graph.nodes:
            raise SappError(f"graph {graph.name!r} has no operators; capture the model first")
        L = len(mesh.levels)
        if roles is not None:
            roles = tuple(roles)
            if len(roles) != L:
                raise SappError(f"level_roles has {len(roles)} entries but the mesh has {L} levels; give one per level")
            bad = [r for r in roles if r not in ROLES]
            if bad:
                raise SappError(f"level role {bad[0]!r} is unknown; use 'dp', 'tp' or None")
            dp = 1
            for r, lv in zip(roles, mesh.levels):
                if r == "dp":
                    dp *= lv.size
            if dp > 1 and not any(d.batch and d.splittable and d.size % dp == 0 for n in graph.nodes.values()
                                  for d in n.dims):
                raise SappError(f"level_roles ask for data parallelism of {dp} but no batch dim of the graph is "
                                f"divisible by {dp}; use a larger batch or fewer dp levels")
        self.graph, self.mesh, self.cluster, self.settings, self.roles = graph, mesh, cluster, settings, roles
        self.L = L
        ensure_widths(graph)       # autocast widths before block_map compares nodes
        rep = block_map(graph) if share_blocks else {}
        self.vars, self.var_of, self.mult = [], {}, []
        for name in graph.nodes:
            r = rep.get(name, name)
            if r == name:
                self.var_of[name] = len(self.vars)
                self.vars.append(name)
                self.mult.append(0)
            else:
                self.var_of[name] = self.var_of[r]
            self.mult[self.var_of[name]] += 1
        self.nodes = [graph.nodes[n] for n in self.vars]
        owners = param_owners(graph)
        self.owned = [owners[n] for n in self.vars]
        savers = first_savers(graph, mesh, settings)
        none = (None,) * L
        self.save_mask = [[savers.get(tid) == n for tid, _ in saved_items(graph.nodes[n], none, mesh, settings)]
                          for n in self.vars]
        # edges between variables, merged by (producer var, consumer var, operand index)
        agg = {}
        for p, c, i in graph.edges():
            key = (self.var_of[p], self.var_of[c], i)
            agg[key] = agg.get(key, 0) + 1
        self.edges, self.self_edges = [], []
        for (pv, cv, i), cnt in sorted(agg.items()):
            (self.self_edges if pv == cv else self.edges).append((pv, cv, i, cnt))
        self.adj = [[] for _ in self.vars]
        for k, (pv, cv, _, _) in enumerate(self.edges):
            self.adj[pv].append(k)
            self.adj[cv].append(k)
        self.lam = 0.0
        self._node_memo, self._lay_memo, self._rs_memo, self._cands, self._strats = {}, {}, {}, {}, {}
        self._mat_memo = {}
        self.cache = {}
        self._coef_memo = {}         # solver-level caches (e.g. the full-strategy MRF per lambda)

    # ---- candidate choices ------------------------------------------------------------------------
    def level_options(self, v, level, current):
        """Choices for var v on `level` given its choices on the other levels (`current`)."""
        key = (v, level, tuple(c for i, c in enumerate(current) if i != level))
        hit = self._cands.get(key)
        if hit is not None:
            return hit
        node, lv = self.nodes[v], self.mesh.levels[level]
        role = self.roles[level] if self.roles else None
        f = {}
        for i, d in enumerate(current):
            if d is not None and i != level:
                f[d] = f.get(d, 1) * self.mesh.levels[i].size
        out = [None]
        for d in node.dims:
            if not d.splittable or d.size <= 1:
                continue
            if (role == "dp" and not d.batch) or (role == "tp" and d.batch):
                continue
            if d.size % (f.get(d.name, 1) * lv.size) == 0:
                out.append(d.name)
        self._cands[key] = out
        return out

    def strategies(self, v):
        hit = self._strats.get(v)
        if hit is None:
            hit = self._strats[v] = op_strategies(self.nodes[v], self.mesh, self.roles)
        return hit

    def strategy_bound(self, v) -> int:
        """Upper bound on len(strategies(v)) without enumerating them."""
        node = self.nodes[v]
        k = 1 + sum(1 for d in node.dims if d.splittable and d.size > 1)
        return k ** self.L

    # ---- costs ------------------------------------------------------------------------------------
    def node_terms(self, v, s):
        """(time, memory bytes) of one copy of var v under strategy s."""
        key = (v, s)
        hit = self._node_memo.get(key)
        if hit is not None:
            return hit
        node = self.nodes[v]
        c = node_cost(node, s, self.mesh, self.cluster, self.settings, params=self.owned[v])
        mem = c.state_bytes
        for keep, (_, b) in zip(self.save_mask[v], saved_items(node, s, self.mesh, self.settings)):
            if keep:
                mem += b
        res = (c.time_s, mem)
        self._node_memo[key] = res
        return res

    def unary(self, v, s) -> float:
        t, m = self.node_terms(v, s)
        u = self.mult[v] * (t + self.lam * m)
        for pv, cv, i, cnt in self.self_edges:
            if pv == v:
                u += cnt * self._edge_time(pv, cv, i, s, s)
        return u

    def unary_vec(self, v, strats):
        return np.array([self.unary(v, s) for s in strats], dtype=float)

    def _layouts(self, pv, cv, i, sp, sc):
        key = (pv, cv, i, sp, sc)
        hit = self._lay_memo.get(key)
        if hit is None:
            cons = self.nodes[cv]
            hit = edge_layouts(self.nodes[pv], cons.operands[i], sp, sc, cons)
            self._lay_memo[key] = hit
        return hit

    def _rs(self, src, dst, nbytes):
        if src == dst:
            return 0.0
        key = (src, dst, nbytes)
        hit = self._rs_memo.get(key)
        if hit is None:
            hit = reshard_time(src, dst, nbytes, self.mesh, self.cluster)
            self._rs_memo[key] = hit
        return hit

    def _width(self, pv, o):
        """Bytes per element an edge moves: the producer's output as it is (see edges.edge_times)."""
        if self.settings.is_float(o.dtype):
            return out_bytes(self.nodes[pv], self.settings)
        return self.settings.act_bytes(o.dtype)

    def _widths(self, pv, cv, o):
        """(forward, backward) bytes an element the edge moves (FP8 tensor-parallel widths: costmodel/fp8.py)."""
        w, st = self._width(pv, o), self.settings
        return (edge_width(self.nodes[pv], self.nodes[cv], False, st, w),
                edge_width(self.nodes[pv], self.nodes[cv], True, st, w))

    def _edge_time(self, pv, cv, i, sp, sc):
        o = self.nodes[cv].operands[i]
        f_src, f_dst, b_src, b_dst = self._layouts(pv, cv, i, sp, sc)
        wf, wb = self._widths(pv, cv, o)
        t = self._rs(f_src, f_dst, o.numel * wf)
        if self.settings.is_float(o.dtype) and carries_grad(self.nodes[pv]):
            t += self._rs(b_src, b_dst, o.numel * wb)
        return t

    def edge(self, k, sp, sc) -> float:
        pv, cv, i, cnt = self.edges[k]
        return cnt * self._edge_time(pv, cv, i, sp, sc)

    def edge_factors(self, k, sps, scs):
        """The edge's cost as two small tables over layout classes: returns a list of
        (producer class per strategy, consumer class per strategy, table[prod class, cons class]),
        one for the forward value and one for the backward gradient (if any); cost multiplicity
        included.  Many strategies share a layout, so the tables are much smaller than the matrix."""
        pv, cv, i, cnt = self.edges[k]
        o = self.nodes[cv].operands[i]
        wf, wb = self._widths(pv, cv, o)
        prod, cons = self.nodes[pv], self.nodes[cv]
        pf, pb = [], []
        for s in sps:
            ol = output_layout(prod, s)
            pf.append(fold_src(translate(prod.out, o, ol), o, cons))
            pb.append(fold_src(translate(prod.out, o, output_grad_layout(ol)), o, cons))
        cf = [fold_dst(input_layout(o.dims, s), s, o, cons) for s in scs]
        out = [self._factor(pf, cf, o.numel * wf, cnt, False)]
        if self.settings.is_float(o.dtype) and carries_grad(prod):
            cb = [fold_dst(input_grad_layout(o.dims, s), s, o, cons) for s in scs]
            out.append(self._factor(pb, cb, o.numel * wb, cnt, True))
        return out

    def _factor(self, prod_lays, cons_lays, nbytes, cnt, backward):
        up, pi = _uniq(prod_lays)
        uc, ci = _uniq(cons_lays)
        A = np.empty((len(up), len(uc)))
        B = np.empty((len(up), len(uc)))
        memo = self._coef_memo
        for a, x in enumerate(up):
            for b, y in enumerate(uc):
                key = (y, x) if backward else (x, y)
                c = memo.get(key)
                if c is None:
                    c = memo[key] = reshard_coeffs(key[0], key[1], self.mesh, self.cluster)
                A[a, b], B[a, b] = c
        T = cnt * (A + B * nbytes) if nbytes > 0 else np.zeros_like(A)
        return pi, ci, T

    def edge_mat(self, k, sps, scs):
        """Cost matrix of edge k over producer strategies `sps` x consumer strategies `scs`, built from
        the (few) distinct layout pairs; cached (repeated refinement sweeps ask again)."""
        key = (k, tuple(sps), tuple(scs))
        hit = self._mat_memo.get(key)
        if hit is not None:
            return hit
        M = None
        for pi, ci, T in self.edge_factors(k, sps, scs):
            part = T[np.ix_(pi, ci)]
            M = part if M is None else M + part
        if len(self._mat_memo) > 200_000:
            self._mat_memo.clear()
        self._mat_memo[key] = M
        return M

    # ---- whole assignments ------------------------------------------------------------------------
    def energy(self, strat) -> float:
        e = sum(self.unary(v, strat[v]) for v in range(len(self.vars)))
        for k, (pv, cv, _, _) in enumerate(self.edges):
            e += self.edge(k, strat[pv], strat[cv])
        return e

    def memory(self, strat) -> float:
        return sum(self.mult[v] * self.node_terms(v, strat[v])[1] for v in range(len(self.vars)))

    def expand(self, strat) -> dict:
        return {n: tuple(strat[self.var_of[n]]) for n in self.graph.nodes}


def _uniq(items):
    index, out, idx = {}, [], np.empty(len(items), dtype=np.int64)
    for j, it in enumerate(items):
        k = index.get(it)
        if k is None:
            k = index[it] = len(out)
            out.append(it)
        idx[j] = k
    return out, idx
