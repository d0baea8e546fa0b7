"""Minimising a sum of unary and pairwise costs over discrete labels (a pairwise MRF).

The move used everywhere is *forest block descent*: pick a set of variables whose induced subgraph
is a forest, fix every other variable, and set the forest's variables to their exact joint optimum by
dynamic programming (min-sum message passing on trees).  The energy never increases; a forest
contains every chain and tree, so chains/trees are solved exactly in one move, and single-variable
ICM is the special case of a one-node forest."""
from __future__ import annotations

import random

import numpy as np


class MRF:
    def __init__(self, unaries, pairs):
        """unaries: list of 1-D arrays; pairs: iterable of (u, v, M) with M[label_u, label_v]."""
        self.U = [np.asarray(u, dtype=float) for u in unaries]
        merged = {}
        for u, v, M in pairs:
            if u == v:
                self.U[u] = self.U[u] + np.diag(M)
                continue
            if u > v:
                u, v, M = v, u, M.T
            merged[(u, v)] = merged[(u, v)] + M if (u, v) in merged else np.asarray(M, dtype=float)
        self.pairs = merged
        self.nbrs = [[] for _ in self.U]
        for (u, v), M in sorted(merged.items()):
            self.nbrs[u].append((v, M))
            self.nbrs[v].append((u, M.T))

    def energy(self, x) -> float:
        e = sum(float(self.U[v][x[v]]) for v in range(len(self.U)))
        for (u, v), M in self.pairs.items():
            e += float(M[x[u], x[v]])
        return e

    def forest_move(self, x, order):
        x = list(x)
        parent_uf = {}

        def find(a):
            while parent_uf[a] != a:
                parent_uf[a] = parent_uf[parent_uf[a]]
                a = parent_uf[a]
            return a

        inF = set()
        for v in order:
            roots = [find(w) for w, _ in self.nbrs[v] if w in inF]
            if len(roots) != len(set(roots)):
                continue
            parent_uf[v] = v
            for r in roots:
                parent_uf[r] = v
            inF.add(v)
        eff = {}
        for v in inF:
            u = self.U[v].copy()
            for w, M in self.nbrs[v]:
                if w not in inF:
                    u += M[:, x[w]]
            eff[v] = u
        seen = set()
        for root in order:
            if root not in inF or root in seen:
                continue
            # iterative DFS over forest edges
            seq, par, stack = [], {root: None}, [root]
            seen.add(root)
            while stack:
                v = stack.pop()
                seq.append(v)
                for w, _ in self.nbrs[v]:
                    if w in inF and w not in seen:
                        seen.add(w)
                        par[w] = v
                        stack.append(w)
            total = {v: eff[v].copy() for v in seq}
            arg = {}
            for v in reversed(seq):
                p = par[v]
                if p is None:
                    continue
                M = next(M for w, M in self.nbrs[p] if w == v)      # rows: p labels, cols: v labels
                cand = M + total[v][None, :]
                arg[v] = cand.argmin(axis=1)
                total[p] += cand.min(axis=1)
            x[root] = int(total[root].argmin())
            for v in seq[1:]:
                x[v] = int(arg[v][x[par[v]]])
        return x

    def orders(self, n_random=4, seed=0):
        n = len(self.U)
        base = list(range(n))
        out = [base, base[::-1]]
        if n <= 40:
            out += [base[i:] + base[:i] for i in range(1, n)]
        rng = random.Random(seed)
        for _ in range(n_random):
            o = base[:]
            rng.shuffle(o)
            out.append(o)
        return out

    def optimize(self, x, max_rounds=20, orders=None):
        orders = orders or self.orders()
        best = self.energy(x)
        for _ in range(max_rounds):
            start = best
            for o in orders:
                y = self.forest_move(x, o)
                e = self.energy(y)
                if e < best - 1e-15 * max(1.0, abs(best)):
                    x, best = y, e
            if best >= start - 1e-12 * max(1.0, abs(start)):
                break
        return x, best
