"""Exact optimum of the search objective with ortools CP-SAT: one Boolean per (op, strategy), exactly
one per op; each edge's cost matrix is linearised with pair variables tied to both endpoints'
marginals (sum_b y[a,b] = x_u[a], sum_a y[a,b] = x_v[b], a tight formulation); optional memory
constraint.  Costs are scaled to integers finely enough that rounding is far below 0.01%."""
from __future__ import annotations

import numpy as np

from ..errors import SappError
from .dominance import prune
from .recursive import full_mrf

MAX_PAIR_VARS = 3_000_000


def exact_search(prob, memory_budget=None, time_limit_s=120.0, hint=None, backend="cbc"):
    """Returns (strategies or None, proven optimal).  backend: "cbc" | "scip" | "cpsat"."""

    S_all, mrf = full_mrf(prob)
    n = len(S_all)
    if memory_budget is None:
        keep = prune(mrf)        # dominance is only safe without the memory constraint
    else:
        keep = [np.arange(len(s)) for s in S_all]
    S = [[S_all[v][i] for i in keep[v]] for v in range(n)]
    U = [mrf.U[v][keep[v]] for v in range(n)]
    pairs = {}
    for (u, v), M in mrf.pairs.items():
        pairs[(u, v)] = M[np.ix_(keep[u], keep[v])]
    npairs = sum(M.size for M in pairs.values())
    if npairs > MAX_PAIR_VARS:
        raise SappError(f"exact search needs {npairs:.3g} pair variables (limit {MAX_PAIR_VARS:.0e}); "
                        "use a smaller mesh/graph or method='recursive'")
    # push row/column minima into the unaries: smaller integers, all-zero matrices need nothing
    for key, M in list(pairs.items()):
        u, v = key
        r = M.min(axis=1)
        M = M - r[:, None]
        c = M.min(axis=0)
        M = M - c[None, :]
        U[u] = U[u] + r
        U[v] = U[v] + c
        pairs[key] = M
    U = [u - u.min() for u in U]
    mem = None
    if memory_budget is not None:
        mem = [np.array([prob.mult[v] * prob.node_terms(v, s)[1] for s in S[v]]) for v in range(n)]
    if backend == "cpsat":
        sol, optimal = _cpsat(S, U, pairs, mem, memory_budget, hint, time_limit_s)
    else:
        sol, optimal = _mip(backend, S, U, pairs, mem, memory_budget, time_limit_s)
    if sol is None:
        return None, False
    return [S[v][sol[v]] for v in range(n)], optimal


def _mip(backend, S, U, pairs, mem, memory_budget, time_limit_s):
    """Linear solver (SCIP / CBC): x binary, pair variables continuous (the marginal equalities make
    them 0/1 once x is integral)."""
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver(backend.upper())
    if solver is None:
        raise SappError(f"ortools has no {backend} backend here; use exact_backend='cpsat'")
    solver.SetTimeLimit(int(time_limit_s * 1000))
    n = len(S)
    # MIP tolerances are absolute: bring the costs (often micro-seconds) to O(1e6)
    ref = max([float(u.max()) for u in U] + [float(M.max()) for M in pairs.values()] + [1e-30])
    U = [u * (1e6 / ref) for u in U]
    pairs = {k: M * (1e6 / ref) for k, M in pairs.items()}
    x = [[solver.BoolVar(f"x{v}_{i}") for i in range(len(S[v]))] for v in range(n)]
    obj = solver.Objective()
    for v in range(n):
        solver.Add(solver.Sum(x[v]) == 1)
        for i, c in enumerate(U[v]):
            if c:
                obj.SetCoefficient(x[v][i], float(c))
    for (u, v), M in sorted(pairs.items()):
        if not M.any():
            continue
        y = [[solver.NumVar(0.0, 1.0, f"y{u}_{v}_{a}_{b}") for b in range(M.shape[1])] for a in range(M.shape[0])]
        for a in range(M.shape[0]):
            solver.Add(solver.Sum(y[a]) == x[u][a])
        for b in range(M.shape[1]):
            solver.Add(solver.Sum([y[a][b] for a in range(M.shape[0])]) == x[v][b])
        for a in range(M.shape[0]):
            for b in range(M.shape[1]):
                if M[a, b]:
                    obj.SetCoefficient(y[a][b], float(M[a, b]))
    if mem is not None:
        solver.Add(solver.Sum([float(mem[v][i]) * x[v][i] for v in range(n) for i in range(len(S[v]))])
                   <= float(memory_budget))
    obj.SetMinimization()
    status = solver.Solve()
    if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return None, False
    sol = [max(range(len(S[v])), key=lambda i: x[v][i].solution_value()) for v in range(n)]
    return sol, status == pywraplp.Solver.OPTIMAL


def _cpsat(S, U, pairs, mem, memory_budget, hint, time_limit_s):
    from ortools.sat.python import cp_model

    n = len(S)
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
    if mem is not None:
        mscale = 1e6 / max(memory_budget, 1.0)
        terms = []
        for v in range(n):
            for i in range(len(S[v])):
                m = int(np.ceil(mem[v][i] * mscale))
                if m:
                    terms.append(m * x[v][i])
        model.Add(sum(terms) <= int(np.floor(memory_budget * mscale)))
    if hint is not None:
        for v in range(n):
            for i, s in enumerate(S[v]):
                model.AddHint(x[v][i], s == tuple(hint[v]))
    model.Minimize(sum(obj))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 2
    solver.parameters.random_seed = 0
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, False
    sol = [next(i for i in range(len(S[v])) if solver.Value(x[v][i])) for v in range(n)]
    return sol, status == cp_model.OPTIMAL
