"""Plans over mixed clusters: data-parallel replicas on device groups of different kinds.

Each group runs its own layout (the homogeneous joint search, unchanged, on the group's Cluster and
its share of the global batch); the groups' gradients then meet over the link between groups.
A step costs the slowest group's step on its share plus that cross-group all-reduce, so the search
splits the batch unevenly, in proportion to what each group does in a step:

    step(b_1..b_G) = max_g T_g(b_g) + sync(groups with b_g > 0)

T_g is the joint search's best step for group g at global batch b_g (infinite where nothing fits).
sync is a ring all-reduce of the full gradient between the groups, striped over the devices of the
smallest group taking part (each device carries its slice over its share of the link), priced after
the groups' own gradient sync and not overlapped with it.

Shares are whole multiples of a quantum q (a divisor of the batch).  The free search starts from
shares proportional to each group's compute, then sets them in proportion to each group's measured
rate there (share / T_g; again while that improves), then moves quanta from the slowest group to
the one that stays fastest with them, one quantum at a time after a rebalance (in steps halving
from an eighth of the batch where none helped), until no move improves; every group alone is a
candidate too.  `exhaustive=True` enumerates every composition of the batch into quanta instead
(small cases: bench/hetero_exhaustive.py and tests/test_hetero.py check the two agree).

A candidate split only matters if it beats the best so far, so it is priced against it: each
group's joint search gets the cutoff best - sync (joint_search's `cutoff`: configurations whose
bound is above it are pruned unpriced, and the answer is "above" once nothing left can be at or
below it) and, once one group is above, the others are not searched; the group likeliest to be
above goes first.  A split that wins is thus priced exactly, and the walk takes the moves it would
take with every candidate priced in full.  A group's searches share joint_search's `caches` (the tp
layouts, the template and its rebatched copies, cost memos, the stage profiles' sampled unit
numbers below the top sample, sp sets and ZeRO-stage terms): only what reads the share (the
configurations, the top time sample at share / dp, bounds, evaluations) is redone.  The baseline
over all devices as the slowest kind starts from that group's tp layouts.  On gpt3-13b over 512
A100s + 512 H100s: four exact group searches (two cold) and three bounded ones, the split search
2.3-2.7x the homogeneous search of 1,024 devices on a loaded box (bench/hetero_figures.py --only
scale, RESULTS §12); the plans are byte-identical to those of ten exact searches.
"""
from __future__ import annotations

import math
import time

from ..errors import InfeasibleError, SappError


class GroupPricer:
    """T_g(b), memoised: the joint search's result for group g at batch b (None where nothing fits).
    The searches of one group share what does not depend on its share (joint.context._shared: tp
    layouts, templates, cost memos, sampled unit numbers), so a second share costs the bound-ordered
    search, not the stage profiles' building again.  `time(g, b, cutoff)`: where the caller only needs
    to know whether T_g(b) is at or below `cutoff`, the search stops once its bounds pass the cutoff
    and the answer is just "above" (a lower bound, memoised as such: an exact answer is searched again
    when asked for)."""

    def __init__(self, graph, mc, constraints, settings, search_fn):
        self.graph, self.mc, self.cons, self.settings, self.search_fn = graph, mc, constraints, settings, search_fn
        self.cache = {}
        self.above = {}                             # (g, b) -> the highest cutoff T_g(b) is known to exceed
        self.shared = [{} for _ in mc.groups]       # per group: joint_search's `caches`
        self.searches = 0                           # joint searches run, bounded ones included
        self.group_cons = None                      # per group: its own constraints (None: `cons` for every group)

    def result(self, g, b):
        key = (g, b)
        if key not in self.cache:
            self.cache[key] = self._search(g, b, None)
        return self.cache[key]

    def _search(self, g, b, cutoff):
        from .joint import joint_search
        self.searches += 1
        try:
            cons = self.cons if self.group_cons is None else self.group_cons[g]
            return joint_search(self.graph, self.mc.groups[g], global_batch=b, constraints=cons,
                                settings=self.settings, search_fn=self.search_fn, caches=self.shared[g],
                                cutoff=cutoff)
        except SappError:          # infeasible or no layout for this share: not a candidate
            return None

    def estimate(self, g, b):
        """T_g(b) guessed from the group's nearest exact share (time per sample there): only the order
        _price searches the groups in (the one likeliest above the cutoff first)."""
        near = [(abs(k[1] - b), k[1], r.step_time_s) for k, r in self.cache.items() if k[0] == g and r is not None]
        if not near:
            return 0.0
        _, b0, t0 = min(near)
        return t0 * b / b0

    def time(self, g, b, cutoff=None):
        """T_g(b) exactly, or (with `cutoff`) any value above the cutoff when T_g(b) is above it."""
        if b == 0:
            return 0.0
        key = (g, b)
        if key not in self.cache and cutoff is not None:
            if self.above.get(key, -math.inf) >= cutoff:
                return math.inf
            r = self._search(g, b, cutoff)
            if r is None:
                # above the cutoff, or nothing fits at all (joint_search raised): both "above" here
                self.above[key] = max(cutoff, self.above.get(key, -math.inf))
                return math.inf
            self.cache[key] = r
        r = self.result(g, b)
        return math.inf if r is None else r.step_time_s


def sync_s(graph, mc, settings, used) -> float:
    """Ring all-reduce of the gradient between the groups in `used` (indices)."""
    k = len(used)
    if k < 2:
        return 0.0
    lanes = min(mc.groups[g].devices for g in used)
    grad = graph.param_count() * settings.grad_bytes
    return 2 * (k - 1) / k * grad / (lanes * mc.link_bw) + 2 * (k - 1) * mc.link_latency


def quantum(global_batch, groups) -> int:
    """The share granularity: the largest divisor of the batch giving at least 16 quanta per group
    (every divisor for small batches), so a share can follow a group's speed to ~1/16."""
    want = max(1, global_batch // (16 * groups))
    return max(d for d in range(1, want + 1) if global_batch % d == 0)


def _price(pr, graph, mc, settings, shares, q, beat=None):
    """The step at these shares; with `beat` (the best step so far), any value >= beat where the step
    cannot beat it: each group's search then stops at beat - sync, and once one group is above that
    the others are not searched (those searched already come first, then the larger shares)."""
    used = [g for g, k in enumerate(shares) if k > 0]
    sync = sync_s(graph, mc, settings, used)
    if beat is None:
        t = max(pr.time(g, shares[g] * q) for g in used)
        return t + sync if math.isfinite(t) else math.inf
    cutoff = (beat - sync) * (1 + 1e-9)     # (a hair above: t + sync < beat is decided exactly below)
    t = 0.0
    for g in sorted(used, key=lambda g: ((g, shares[g] * q) not in pr.cache, -pr.estimate(g, shares[g] * q))):
        t = max(t, pr.time(g, shares[g] * q, cutoff))
        if t > cutoff:
            return math.inf
    return t + sync


def _compositions(n, k):
    if k == 1:
        yield (n,)
        return
    for first in range(n + 1):
        for rest in _compositions(n - first, k - 1):
            yield (first,) + rest


def _rebalanced(pr, shares, q, n):
    """Shares in proportion to each group's measured rate at its current share (samples per second of
    its step), or None where a group is unused or does not fit or nothing moves."""
    times = [pr.time(g, s * q) for g, s in enumerate(shares)]
    if any(s == 0 or not math.isfinite(t) or t <= 0 for s, t in zip(shares, times)):
        return None
    rate = [s / t for s, t in zip(shares, times)]
    new = [int(n * r / sum(rate)) for r in rate]
    new[max(range(len(new)), key=lambda g: rate[g])] += n - sum(new)
    return None if new == list(shares) else new


def _free(pr, graph, mc, settings, n, q):
    G = len(mc.groups)
    power = [g.devices * g.peak_flops * g.compute_efficiency for g in mc.groups]
    shares = [int(n * p / sum(power)) for p in power]
    shares[max(range(G), key=lambda g: power[g])] += n - sum(shares)
    best = (_price(pr, graph, mc, settings, shares, q), tuple(shares))
    step = max(1, n // 8)
    for _ in range(3):              # the start by measured speed: where the walk needs small steps only
        new = _rebalanced(pr, shares, q, n)
        if new is None:
            break
        c = (_price(pr, graph, mc, settings, new, q, best[0]), tuple(new))
        if not c[0] < best[0]:
            break
        best, shares, step = c, new, 1
    while True:
        improved = False
        times = [pr.time(g, s * q) for g, s in enumerate(shares)]
        slow = max((g for g in range(G) if shares[g] > 0), key=lambda g: times[g])
        mv = min(step, shares[slow])
        cands = []
        for g in range(G):
            if g != slow and mv > 0:
                trial = list(shares)
                trial[slow] -= mv
                trial[g] += mv
                cands.append((_price(pr, graph, mc, settings, trial, q, best[0]), tuple(trial)))
        if cands:
            c = min(cands)
            if c[0] < best[0]:
                best, shares, improved = c, list(c[1]), True
        if not improved:
            if step == 1:
                break
            step //= 2
    for g in range(G):              # every group alone
        alone = tuple(n if i == g else 0 for i in range(G))
        best = min(best, (_price(pr, graph, mc, settings, alone, q, best[0]), alone))
    return best


def search(graph, mc, *, global_batch, constraints=None, settings=None, search_fn=None, exhaustive=False,
           q=None, baselines=True):
    """(best shares in samples, step seconds, details dict).  Raises InfeasibleError when no split fits."""
    from sapp.search.constraints import Constraints
    from ..costmodel import CostSettings
    t0, c0 = time.perf_counter(), time.process_time()
    cons = Constraints.from_dict(constraints)
    settings = settings or CostSettings()
    pr = GroupPricer(graph, mc, cons, settings, search_fn)
    G = len(mc.groups)
    q = q or quantum(global_batch, G)
    if global_batch % q:
        raise SappError(f"share quantum {q} does not divide the global batch {global_batch}")
    n = global_batch // q
    if exhaustive:
        best = min((_price(pr, graph, mc, settings, s, q), s) for s in _compositions(n, G))
    else:
        best = _free(pr, graph, mc, settings, n, q)
    step, shares = best
    if not math.isfinite(step):
        raise InfeasibleError(f"no split of global batch {global_batch} over the groups "
                              f"{', '.join(g.name for g in mc.groups)} fits; add devices or lower the batch")
    search_s, search_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    shares = tuple(s * q for s in shares)
    used = [g for g, b in enumerate(shares) if b > 0]
    detail = {"pricer": pr, "quantum": q, "search_s": search_s, "search_cpu_s": search_cpu_s,
              "evaluations": pr.searches,
              "sync_s": sync_s(graph, mc, settings, used)}
    if baselines:
        detail["alone"] = {mc.groups[g].name: pr.time(g, global_batch) for g in range(G)}
        detail["uniform"] = uniform_baseline(graph, mc, global_batch, cons, settings, search_fn, pr)
    return shares, step, detail


def uniform_cluster(mc):
    """Every device of the mixed cluster priced as the slowest kind (one homogeneous cluster)."""
    slow = mc.slowest()
    total = mc.devices
    if total % slow.gpus_per_node == 0:
        return slow.replace(nodes=total // slow.gpus_per_node, name=f"{slow.name}-uniform")
    return slow.replace(nodes=1, gpus_per_node=total, name=f"{slow.name}-uniform")


def uniform_baseline(graph, mc, global_batch, cons, settings, search_fn, pr=None):
    """The best step on uniform_cluster.  With the split search's GroupPricer `pr`: where the uniform
    cluster is the slowest group with more nodes, it starts from that group's tp layouts (searched
    once per tp degree on one node's tp devices: the node count reaches them nowhere) and units."""
    import dataclasses
    from .joint import joint_search
    uni = uniform_cluster(mc)
    caches = None
    for g, cl in enumerate(mc.groups if pr is not None else ()):
        if dataclasses.replace(uni, nodes=cl.nodes, name=cl.name) == cl and "strategies" in pr.shared[g]:
            caches = {"strategies": pr.shared[g]["strategies"], "units": pr.shared[g]["units"]}
            break
    try:
        return joint_search(graph, uni, global_batch=global_batch, constraints=cons, settings=settings,
                            search_fn=search_fn, caches=caches).step_time_s
    except SappError:
        return math.inf
