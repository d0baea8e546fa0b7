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
        self._forest_cache = {}
        self.nbrs = [[] for _ in self.U]
        for (u, v), M in sorted(merged.items()):
            self.nbrs[u].append((v, M))
            self.nbrs[v].append((u, M.T))

    def energy(self, x) -> float:
        e = sum(float(self.U[v][x[v]]) for v in range(len(self.U)))
        for (u, v), M in self.pairs.items():
            e += float(M[x[u], x[v]])
        return e

    def _forest(self, order, fixed=()):
        """Structure of the forest picked by `order` (vars in `fixed` excluded): list of trees, each
        (preorder list, parent dict, matrix to parent dict).  Independent of the labels: cached."""
        key = (tuple(order), tuple(sorted(fixed)))
        hit = self._forest_cache.get(key)
        if hit is not None:
            return hit
        uf = {}

        def find(a):
            while uf[a] != a:
                uf[a] = uf[uf[a]]
                a = uf[a]
            return a

        inF = set()
        fixed = set(fixed)
        for v in order:
            if v in fixed:
                continue
            roots = [find(w) for w, _ in self.nbrs[v] if w in inF]
            if len(roots) != len(set(roots)):
                continue
            uf[v] = v
            for r in roots:
                uf[r] = v
            inF.add(v)
        trees, seen = [], set()
        for root in order:
            if root not in inF or root in seen:
                continue
            seq, par, mat, stack = [], {root: None}, {}, [root]
            seen.add(root)
            while stack:
                v = stack.pop()
                seq.append(v)
                for w, M in self.nbrs[v]:
                    if w in inF and w not in seen:
                        seen.add(w)
                        par[w] = v
                        mat[w] = M          # rows: parent labels, cols: child labels
                        stack.append(w)
            trees.append((seq, par, mat))
        outside = {v: [(w, M) for w, M in self.nbrs[v] if w not in inF] for v in inF}
        res = (trees, outside)
        self._forest_cache[key] = res
        return res

    def forest_move(self, x, order, fixed=()):
        """Exact joint optimum of the forest chosen by `order`, everything else held at `x`."""
        x = list(x)
        trees, outside = self._forest(order, fixed)
        for seq, par, mat in trees:
            total = {}
            for v in seq:
                u = self.U[v].copy()
                for w, M in outside[v]:
                    u += M[:, x[w]]
                total[v] = u
            arg = {}
            for v in reversed(seq):
                p = par[v]
                if p is None:
                    continue
                cand = mat[v] + total[v][None, :]
                arg[v] = cand.argmin(axis=1)
                total[p] += cand.min(axis=1)
            root = seq[0]
            x[root] = int(total[root].argmin())
            for v in seq[1:]:
                x[v] = int(arg[v][x[par[v]]])
        return x

    def cutset_move(self, x, c, order):
        """Try every label of `c` with the best forest (excluding c) for each: exact whenever
        removing c leaves the rest a forest (graphs with one cycle-cutset node)."""
        best_x, best = x, self.energy(x)
        for lab in range(len(self.U[c])):
            y = list(x)
            y[c] = lab
            y = self.forest_move(y, order, fixed=(c,))
            e = self.energy(y)
            if e < best - 1e-15 * max(1.0, abs(best)):
                best_x, best = y, e
        return best_x, best

    def orders(self, n_random=4, seed=0):
        n = len(self.U)
        base = list(range(n))
        out = [base, base[::-1]]
        if n <= 12:      # small problems: a forest rooted at every op
            out += [base[i:] + base[:i] for i in range(1, n)]
        else:
            n_random = min(n_random, 2)
        rng = random.Random(seed)
        for _ in range(n_random):
            o = base[:]
            rng.shuffle(o)
            out.append(o)
        return out

    def optimize(self, x, max_rounds=20, orders=None, cutset=False):
        """Forest block descent until no move improves; with `cutset`, also one-node cycle-cutset
        moves (each op in turn, most connected first)."""
        orders = orders or self.orders()
        best = self.energy(x)
        cut_order = sorted(range(len(self.U)), key=lambda v: (-len(self.nbrs[v]), v))
        for _ in range(max_rounds):
            start = best
            for o in orders:
                y = self.forest_move(x, o)
                e = self.energy(y)
                if e < best - 1e-15 * max(1.0, abs(best)):
                    x, best = y, e
            if cutset:
                for c in cut_order:
                    if len(self.nbrs[c]) < 2:
                        continue
                    y, e = self.cutset_move(x, c, orders[0])
                    if e < best - 1e-15 * max(1.0, abs(best)):
                        x, best = y, e
            if best >= start - 1e-12 * max(1.0, abs(start)):
                break
        return x, best
