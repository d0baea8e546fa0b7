"""Choose none / selective / full recomputation per block to fit an activation budget at the least
extra compute.

Blocks come in *types* (structurally identical blocks share costs), so the choice per type is a count
choice (how many of its blocks take each policy).  Per type we build the Pareto frontier of
(activation bytes, extra seconds) over all count splits, merge the frontiers of all types (exact:
dominated partial choices can never be completed into a better total), and take the fastest point
that fits.  tests/test_recompute.py checks this against an ortools ILP."""
from __future__ import annotations

import math
from dataclasses import dataclass

POLICIES = ("none", "selective", "full")


@dataclass(frozen=True)
class BlockOption:
    """One block's cost under each policy, per micro-batch: activation bytes kept for backward and
    the extra forward seconds recomputation adds to the backward pass."""
    act: tuple          # (none, selective, full) bytes
    extra: tuple        # (none, selective, full) seconds


@dataclass(frozen=True)
class RecomputeChoice:
    act_bytes: float
    extra_s: float
    counts: tuple       # per type: (n_none, n_selective, n_full)

    @property
    def feasible(self) -> bool:
        return self.act_bytes == self.act_bytes   # not NaN


def _type_frontier(n, opt: BlockOption, allowed):
    """All (act, extra, counts) for n identical blocks, Pareto-pruned, sorted by act ascending."""
    pts = []
    idx = [POLICIES.index(a) for a in allowed]
    for nf in range(n + 1) if 2 in idx else (0,):
        for ns in range(n - nf + 1) if 1 in idx else (0,):
            nn = n - nf - ns
            if nn and 0 not in idx:
                continue
            act = nn * opt.act[0] + ns * opt.act[1] + nf * opt.act[2]
            ext = nn * opt.extra[0] + ns * opt.extra[1] + nf * opt.extra[2]
            pts.append((act, ext, (nn, ns, nf)))
    return _pareto(pts)


def _pareto(pts):
    pts.sort(key=lambda t: (t[0], t[1]))
    out, best = [], float("inf")
    for p in pts:
        if p[1] < best - 1e-15:
            out.append(p)
            best = p[1]
    return out


def frontier(types, allowed=POLICIES):
    """types: list of (count, BlockOption).  Returns the merged Pareto list of
    (act_bytes, extra_s, counts tuple per type), act ascending / extra descending."""
    cur = [(0.0, 0.0, ())]
    for n, opt in types:
        f = _type_frontier(n, opt, allowed)
        merged = [(a1 + a2, e1 + e2, c1 + (c2,)) for a1, e1, c1 in cur for a2, e2, c2 in f]
        cur = _pareto(merged)
    return cur


def choose_recompute(types, act_budget, allowed=POLICIES):
    """Fastest choice whose activation bytes fit `act_budget` (per micro-batch), or None."""
    best = None
    for act, ext, counts in frontier(types, allowed):
        if act <= act_budget * (1 + 1e-12):
            if best is None or ext < best.extra_s - 1e-15:
                best = RecomputeChoice(act, ext, counts)
    return best


def choose_uniform(n, opt: BlockOption, act_budget, allowed=POLICIES):
    """Fast exact path for n identical blocks: for each number of full blocks take the least number
    of selective blocks that fits (time grows with every recomputed block).  O(n)."""
    use = [POLICIES.index(a) for a in allowed]
    a0, a1, a2 = opt.act
    e0, e1, e2 = opt.extra
    lim = act_budget * (1 + 1e-12)
    best = None
    for nf in (range(n + 1) if 2 in use else (0,)):
        rest = n - nf
        if 0 in use and 1 in use:
            over = rest * a0 + nf * a2 - lim
            if over <= 0:
                ns = 0
            elif a0 - a1 <= 0:
                continue
            else:
                ns = math.ceil(over / (a0 - a1) - 1e-9)
                if ns > rest:
                    continue
        elif 1 in use:
            ns = rest
        elif 0 in use:
            ns = 0
        else:
            if rest:
                continue
            ns = 0
        act = (rest - ns) * a0 + ns * a1 + nf * a2
        if act > lim:
            continue
        ext = (rest - ns) * e0 + ns * e1 + nf * e2
        if best is None or ext < best.extra_s - 1e-15:
            best = RecomputeChoice(act, ext, ((rest - ns, ns, nf),))
    return best
