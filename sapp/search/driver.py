"""Runs a search method, with the memory budget enforced by a Lagrange multiplier (bisection)."""
from __future__ import annotations

import math
import time

from ..costmodel import evaluate_sharding
from ..errors import SappError
from .result import ShardingResult
from .problem import Problem

METHODS = ("recursive", "exact", "exhaustive")


def _solve(prob, method, memory_budget=None):
    if method == "recursive":
        from .recursive import recursive_search
        return recursive_search(prob)
    if method == "exhaustive":
        from .exhaustive import exhaustive_search
        return exhaustive_search(prob)
    from .exact import exact_search
    strat, _ = exact_search(prob, memory_budget)
    return strat


def run(graph, mesh, cluster, settings, *, memory_budget=None, level_roles=None, method="recursive"):
    if method not in METHODS:
        raise SappError(f"unknown search method {method!r}; use one of {', '.join(METHODS)}")
    if memory_budget is not None and not memory_budget > 0:
        raise SappError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")
    t0 = time.perf_counter()
    prob = Problem(graph, mesh, cluster, settings, level_roles, share_blocks=True)
    strat = None
    if memory_budget is None:
        strat = _solve(prob, method)
    elif method == "exact":
        strat = _solve(prob, method, memory_budget)
        if strat is None:   # nothing fits: report the least-memory plan
            strat = _lagrange(prob, method, memory_budget)
    else:
        strat = _lagrange(prob, method, memory_budget)
    strategies = prob.expand(strat)
    cost = evaluate_sharding(graph, strategies, mesh, cluster, settings)
    mem = cost.peak_memory_bytes
    feasible = memory_budget is None or mem <= memory_budget * (1 + 1e-9)
    return ShardingResult(strategies, cost, method, feasible, mem, time.perf_counter() - t0)


def _lagrange(prob, method, budget):
    """Smallest penalty lambda (seconds per byte) whose optimum fits in `budget`; the least-memory
    solution found if none does.  Two solves settle the infeasible case (lambda = 0 and a lambda at
    which memory dominates); otherwise bisection in log space between them."""
    prob.lam = 0.0
    s0 = _solve(prob, method)
    m0 = prob.memory(s0)
    if m0 <= budget:
        return s0
    lam_scale = max(prob.energy(s0), 1e-12) / max(m0, 1.0)
    lo, hi = lam_scale * 1e-4, lam_scale * 1e6
    prob.lam = hi
    best = _solve(prob, method)
    if prob.memory(best) > budget:       # even memory-first does not fit: report it, infeasible
        prob.lam = 0.0
        return best if prob.memory(best) < m0 else s0
    for _ in range(14):
        if hi / lo < 1.1:
            break
        mid = math.sqrt(lo * hi)
        prob.lam = mid
        s = _solve(prob, method)
        if prob.memory(s) <= budget:
            hi, best = mid, s
        else:
            lo = mid
    prob.lam = 0.0
    return best
