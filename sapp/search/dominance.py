"""Provably safe pruning of strategies: strategy a of an op is dropped when some b is at least as
good whatever the neighbours do, i.e. U[a] - U[b] >= sum over incident edges of max_j (M[b, j] -
M[a, j]) (the worst-case loss of switching a -> b is <= the sure gain).  Removing a never removes
every optimum, so exact solvers stay exact on the pruned problem."""
from __future__ import annotations

import numpy as np


def prune(mrf, max_rounds=5):
    n = len(mrf.U)
    alive = [np.ones(len(u), dtype=bool) for u in mrf.U]
    for _ in range(max_rounds):
        changed = False
        for v in range(n):
            idx = np.flatnonzero(alive[v])
            if len(idx) <= 1:
                continue
            U = mrf.U[v][idx]
            worst = np.zeros((len(idx), len(idx)))
            for w, M in mrf.nbrs[v]:
                Mm = M[np.ix_(idx, np.flatnonzero(alive[w]))]
                worst += (Mm[None, :, :] - Mm[:, None, :]).max(axis=2)
            tol = 1e-12 * max(1.0, float(np.abs(U).max()))
            dom = (U[:, None] - U[None, :]) >= worst - tol
            np.fill_diagonal(dom, False)
            for a in range(len(idx)):
                if any(dom[a, b] and alive[v][idx[b]] for b in range(len(idx))):
                    alive[v][idx[a]] = False
                    changed = True
        if not changed:
            break
    return [np.flatnonzero(a) for a in alive]
