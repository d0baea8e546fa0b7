"""Runs a search method, with the memory budget enforced by a Lagrange multiplier (bisection)."""
from __future__ import annotations

import math
import time

from ..costmodel import evaluate_sharding
from ..errors import SappError
from .api import ShardingResult
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
    solution found if none does."""
    prob.lam = 0.0
    s0 = _solve(prob, method)
    m0 = prob.memory(s0)
    if m0 <= budget:
        return s0
    t0 = prob.energy(s0)
    lam_scale = max(t0, 1e-12) / max(m0, 1.0)
    lo, hi, best, least = None, None, None, (m0, s0)
    lam = lam_scale
    for _ in range(12):      # grow until feasible
        prob.lam = lam
        s = _solve(prob, method)
        m = prob.memory(s)
        if m < least[0]:
            least = (m, s)
        if m <= budget:
            hi, best = lam, s
            break
        lo = lam
        lam *= 10.0
    if best is None:
        prob.lam = 0.0
        return least[1]
    lo = lo if lo is not None else 0.0
    for _ in range(10):      # bisection in log space between the last infeasible and first feasible
        mid = math.sqrt(lo * hi) if lo > 0 else hi / 10.0
        prob.lam = mid
        s = _solve(prob, method)
        if prob.memory(s) <= budget:
            hi, best = mid, s
        else:
            lo = mid
        if lo > 0 and hi / lo < 1.05:
            break
    prob.lam = 0.0
    return best
