"""Exact optimum of the search objective with ortools CP-SAT: one Boolean per (op, strategy), exactly
one per op; each edge's cost matrix is linearised with pair variables tied to both endpoints'
marginals (sum_b y[a,b] = x_u[a], sum_a y[a,b] = x_v[b], a tight formulation); optional memory
constraint.  Costs are scaled to integers finely enough that rounding is far below 0.01%."""
from __future__ import annotations

import numpy as np

from ..errors import SappError
from .recursive import full_mrf

MAX_PAIR_VARS = 3_000_000


def exact_search(prob, memory_budget=None, time_limit_s=120.0):
    from ortools.sat.python import cp_model

    S, mrf = full_mrf(prob)
    n = len(S)
    npairs = sum(M.size for M in mrf.pairs.values())
    if npairs > MAX_PAIR_VARS:
        raise SappError(f"exact search needs {npairs:.3g} pair variables (limit {MAX_PAIR_VARS:.0e}); "
                        "use a smaller mesh/graph or method='recursive'")
    # Shift each row/column so the minimum of every edge matrix is pushed into the unaries: smaller
    # integers and zero-cost pairs need no variable.
    U = [u.copy() for u in mrf.U]
    pairs = {}
    for (u, v), M in mrf.pairs.items():
        r = M.min(axis=1)
        M2 = M - r[:, None]
        c = M2.min(axis=0)
        M2 = M2 - c[None, :]
        U[u] = U[u] + r
        U[v] = U[v] + c
        pairs[(u, v)] = M2
    offs = [float(u.min()) for u in U]
    U = [u - o for u, o in zip(U, offs)]
    ref = max([float(u.max()) for u in U] + [float(M.max()) for M in pairs.values()] + [1e-30])
    scale = 1e9 / ref
    model = cp_model.CpModel()
    x = [[model.NewBoolVar(f"x{v}_{i}") for i in range(len(S[v]))] for v in range(n)]
    for v in range(n):
        model.AddExactlyOne(x[v])
    obj = []
    for v in range(n):
        for i, c in enumerate(U[v]):
            ci = int(round(c * scale))
            if ci:
                obj.append(ci * x[v][i])
    for (u, v), M in sorted(pairs.items()):
        Mi = np.rint(M * scale).astype(np.int64)
        if not Mi.any():
            continue
        y = [[model.NewBoolVar(f"y{u}_{v}_{a}_{b}") for b in range(M.shape[1])] for a in range(M.shape[0])]
        for a in range(M.shape[0]):
            model.Add(sum(y[a]) == x[u][a])
        for b in range(M.shape[1]):
            model.Add(sum(y[a][b] for a in range(M.shape[0])) == x[v][b])
        for a in range(M.shape[0]):
            for b in range(M.shape[1]):
                if Mi[a, b]:
                    obj.append(int(Mi[a, b]) * y[a][b])
    if memory_budget is not None:
        mscale = 1e6 / max(memory_budget, 1.0)
        terms = []
        for v in range(n):
            for i, s in enumerate(S[v]):
                m = int(np.ceil(prob.mult[v] * prob.node_terms(v, s)[1] * mscale))
                if m:
                    terms.append(m * x[v][i])
        model.Add(sum(terms) <= int(np.floor(memory_budget * mscale)))
    model.Minimize(sum(obj))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 2
    solver.parameters.random_seed = 0
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, False
    sol = [next(i for i in range(len(S[v])) if solver.Value(x[v][i])) for v in range(n)]
    return [S[v][sol[v]] for v in range(n)], status == cp_model.OPTIMAL
