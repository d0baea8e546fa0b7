"""The double-recursive search (outer recursion: mesh levels, inter-node first; inner: key operators
by decreasing cost, then propagation to the rest), followed by refinement.

Differences from MindSpore SAPP: k-way cuts for any prime k; choices are priced by the real cost
model (compute + gradient sync + resharding bytes on the actual links) rather than a flat penalty;
undecided neighbours are priced optimistically (the best they could still do) instead of ignored;
and every level is then re-optimised by forest block descent (exact on chains and trees), with
whole-level restarts, and - when the per-op strategy lists are small - a final descent over full
strategies.  Memory is handled outside, by a Lagrange multiplier on the unary costs."""
from __future__ import annotations

from sapp.capture.ir import KEY_KINDS
import numpy as np

from .dominance import prune
from .mrf import MRF

FULL_REFINE_MAX = 400          # per-op strategy count up to which full-strategy descent is run
FULL_REFINE_PAIRS = 250_000    # and total edge-matrix entries (keeps it well under a second)
PAIR_REFINE_MAX_LEVELS = 4     # joint two-level moves on meshes with up to this many levels
CUTSET_MAX_OPS = 16            # cycle-cutset moves on problems up to this many variables


def recursive_search(prob, full_refine=True):
    n, L = len(prob.vars), prob.L
    strat = [[None] * L for _ in range(n)]
    none = (None,) * L
    cost0 = [prob.unary(v, none) for v in range(n)]
    key = [v for v in range(n) if prob.nodes[v].kind in KEY_KINDS]
    key_order = sorted(key, key=lambda v: (-cost0[v], v))
    keyset = set(key)
    nonkey = [v for v in range(n) if v not in keyset]

    for lvl in range(L):
        decided = set()

        def tup(v, c):
            s = list(strat[v])
            s[lvl] = c
            return tuple(s)

        def choose(v):
            opts = prob.level_options(v, lvl, strat[v])
            mine = [tup(v, c) for c in opts]
            vals = prob.unary_vec(v, mine)
            for k in prob.adj[v]:
                pv, cv = prob.edges[k][:2]
                w = cv if pv == v else pv
                if w in decided:
                    theirs = [tuple(strat[w])]
                else:   # optimistic: the neighbour will pick what suits it best
                    theirs = [tup(w, c2) for c2 in prob.level_options(w, lvl, strat[w])]
                M = prob.edge_mat(k, mine, theirs) if pv == v else prob.edge_mat(k, theirs, mine).T
                vals = vals + M.min(axis=1)
            strat[v][lvl] = opts[int(vals.argmin())]
            decided.add(v)

        for v in key_order:
            choose(v)
        remaining = list(nonkey)
        while remaining:   # propagate: the op with most decided neighbours goes next
            def n_dec(v):
                return sum(1 for k in prob.adj[v] if (prob.edges[k][1] if prob.edges[k][0] == v else prob.edges[k][0]) in decided)
            v = max(remaining, key=lambda v: (n_dec(v), -v))
            remaining.remove(v)
            choose(v)
        level_refine(prob, strat, lvl)

    refine(prob, strat, full_refine)
    return [tuple(s) for s in strat]


def level_refine(prob, strat, lvl, start=None):
    """Forest block descent over the choices of one level, the other levels fixed."""
    n = len(prob.vars)
    labels = [prob.level_options(v, lvl, strat[v]) for v in range(n)]
    tuples = []
    for v in range(n):
        row = []
        for c in labels[v]:
            s = list(strat[v])
            s[lvl] = c
            row.append(tuple(s))
        tuples.append(row)
    mrf = MRF([prob.unary_vec(v, tuples[v]) for v in range(n)],
              [(pv, cv, prob.edge_mat(k, tuples[pv], tuples[cv])) for k, (pv, cv, _, _) in enumerate(prob.edges)])
    cur = start if start is not None else [labels[v].index(strat[v][lvl]) for v in range(n)]
    x, e = mrf.optimize(cur)
    for v in range(n):
        strat[v][lvl] = labels[v][x[v]]
    return e


def pair_refine(prob, strat, l1, l2):
    """Forest block descent over the joint choices of two levels (the others fixed): escapes the
    local optima where a dim must move from one level to another in one step."""
    n = len(prob.vars)
    labels = []
    for v in range(n):
        row = []
        base = list(strat[v])
        for c1 in prob.level_options(v, l1, [c if i != l2 else None for i, c in enumerate(base)]):
            s = list(base)
            s[l1], s[l2] = c1, None
            for c2 in prob.level_options(v, l2, s):
                s2 = list(s)
                s2[l2] = c2
                row.append(tuple(s2))
        labels.append(row)
    mrf = MRF([prob.unary_vec(v, labels[v]) for v in range(n)],
              [(pv, cv, prob.edge_mat(k, labels[pv], labels[cv])) for k, (pv, cv, _, _) in enumerate(prob.edges)])
    x, e = mrf.optimize([labels[v].index(tuple(strat[v])) for v in range(n)], cutset=n <= 2 * CUTSET_MAX_OPS)
    for v in range(n):
        strat[v][:] = list(labels[v][x[v]])
    return e


def _level_starts(prob, strat, lvl):
    """Whole-level moves: every op replicated on the level, or every op splitting its batch dim."""
    n = len(prob.vars)
    labels = [prob.level_options(v, lvl, strat[v]) for v in range(n)]
    starts = [[0] * n]
    batch = []
    for v in range(n):
        bd = [i for i, c in enumerate(labels[v]) if c is not None and prob.nodes[v].dim(c).batch]
        batch.append(bd[0] if bd else 0)
    starts.append(batch)
    return starts


def refine(prob, strat, full_refine=True, max_rounds=6):
    n = len(prob.vars)
    best = prob.energy([tuple(s) for s in strat])
    done = {}       # level -> assignment it was last refined at (nothing to gain re-running it)
    for rnd in range(max_rounds):
        start = best
        for lvl in range(prob.L):
            snap = tuple(tuple(s) for s in strat)
            if done.get(lvl) == snap:
                continue
            level_refine(prob, strat, lvl)
            here = [prob.level_options(v, lvl, strat[v]).index(strat[v][lvl]) for v in range(n)]
            for st in (_level_starts(prob, strat, lvl) if rnd == 0 else ()):
                if st == here:
                    continue
                trial = [list(s) for s in strat]
                level_refine(prob, trial, lvl, start=st)
                e = prob.energy([tuple(s) for s in trial])
                if e < prob.energy([tuple(s) for s in strat]) - 1e-15:
                    for v in range(n):
                        strat[v][:] = trial[v]
            done[lvl] = tuple(tuple(s) for s in strat)
        if prob.L <= PAIR_REFINE_MAX_LEVELS:
            for l1 in range(prob.L):
                for l2 in range(l1 + 1, prob.L):
                    pair_refine(prob, strat, l1, l2)
        if full_refine:
            full_descent(prob, strat)
        best = prob.energy([tuple(s) for s in strat])
        if best >= start - 1e-12 * max(1.0, abs(start)):
            break
    return best


def full_mrf(prob):
    """(strategy lists, MRF over whole strategies); cached per Lagrange multiplier."""
    hit = prob.cache.get(("full_mrf", prob.lam))
    if hit is not None:
        return hit
    S = [prob.strategies(v) for v in range(len(prob.vars))]
    mrf = MRF([prob.unary_vec(v, S[v]) for v in range(len(S))],
              [(pv, cv, prob.edge_mat(k, S[pv], S[cv])) for k, (pv, cv, _, _) in enumerate(prob.edges)])
    prob.cache[("full_mrf", prob.lam)] = (S, mrf)
    return S, mrf


def pruned(prob):
    hit = prob.cache.get(("pruned", prob.lam))
    if hit is None:
        hit = prob.cache[("pruned", prob.lam)] = [k.tolist() for k in prune(full_mrf(prob)[1])]
    return hit


def _uniform_start(prob, pick):
    """Every op takes pick(node, level options) on every level (in level order)."""
    out = []
    for v in range(len(prob.vars)):
        s = [None] * prob.L
        for lvl in range(prob.L):
            s[lvl] = pick(prob.nodes[v], prob.level_options(v, lvl, s))
        out.append(tuple(s))
    return out


def _batch_pick(node, opts):
    return next((c for c in opts if c is not None and node.dim(c).batch), None)


def full_descent(prob, strat):
    """Forest block + cycle-cutset descent over whole strategies (only when every op has few
    strategies), on the problem pruned by provably safe dominance, from several starts: the current
    assignment, each op's cheapest strategy alone, everything replicated, everything data-parallel."""
    n = len(prob.vars)
    if any(prob.strategy_bound(v) > FULL_REFINE_MAX and len(prob.strategies(v)) > FULL_REFINE_MAX
           for v in range(n) if prob.strategy_bound(v) <= 50 * FULL_REFINE_MAX) or \
            any(prob.strategy_bound(v) > 50 * FULL_REFINE_MAX for v in range(n)):
        return
    if sum(len(prob.strategies(pv)) * len(prob.strategies(cv)) for pv, cv, _, _ in prob.edges) > FULL_REFINE_PAIRS:
        return
    S, mrf = full_mrf(prob)
    keep = [list(k) for k in pruned(prob)]
    index = [{s: i for i, s in enumerate(S[v])} for v in range(n)]
    starts = [[tuple(s) for s in strat], _uniform_start(prob, lambda node, opts: None),
              _uniform_start(prob, _batch_pick)]
    for st in starts:             # starts stay available even where dominance pruned them
        for v in range(n):
            i = index[v][st[v]]
            if i not in keep[v]:
                keep[v].append(i)
    keep = [np.array(sorted(k)) for k in keep]
    sub = MRF([mrf.U[v][keep[v]] for v in range(n)],
              [(u, v, M[np.ix_(keep[u], keep[v])]) for (u, v), M in mrf.pairs.items()])
    pos = [{int(i): j for j, i in enumerate(keep[v])} for v in range(n)]
    xs = [[pos[v][index[v][st[v]]] for v in range(n)] for st in starts]
    xs.append([int(sub.U[v].argmin()) for v in range(n)])
    # forest descent from every start, then cycle-cutset descent from the two best distinct ones
    runs = sorted((sub.optimize(x0)[::-1] for x0 in xs), key=lambda r: r[0])
    best_x, best = None, None
    seen = []
    n_cut = 2 if n <= CUTSET_MAX_OPS else 0     # cutset moves cost labels x forest DP per op
    for e0, x0 in runs:
        if x0 in seen or len(seen) >= max(1, n_cut):
            continue
        seen.append(x0)
        x, e = sub.optimize(x0, cutset=n_cut > 0)
        if best is None or e < best - 1e-15 * abs(best):
            best_x, best = x, e
    for v in range(n):
        strat[v][:] = list(S[v][int(keep[v][best_x[v]])])
