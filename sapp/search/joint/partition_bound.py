"""The exact stage partition of a non-uniform model (DeepSeek-V3-like: 3 dense + 58 MoE blocks; any
model whose blocks differ), pruned by bounds: the same starts as `pipeline.partition.partition_dp`
over `StageEvaluator.seg`, from a fraction of its segment prices.

`partition_dp` prices every (stage i, start k, end j): O(p n^2) calls of `seg`, each tens of
microseconds, and at pp 16-32 over 60+ units that was most of the DeepSeek-V3-like search.  Here the
same dynamic program runs under an upper bound U on the bottleneck (the slowest stage's time), and a
segment is priced only when two lower bounds, each O(1) from the evaluator's prefix tables, leave it
able to matter:

* time: a stage's time is its units' time plus its sends plus recomputation (>= 0), so
  `tfloor(i, k, j) = (T[j] - T[k]) + send_floor(i)` is at most `seg(i, k, j)`'s time (the same float
  expression seg starts from, its sends at the cheapest cut: exactly them when every cut sends the same);
* memory: a fitting stage holds at least its states less the accumulators it may free before its peak
  plus the in-flight copies of its units' least activations (`mfloor`); above the capacity (with a
  margin far wider than float error) seg would say it does not fit.

Within one state (i, j) the candidates k are tried in order of the lower bound of their
(bottleneck, total, k) key, and stop at the first whose bound exceeds the best key found: the same
lexicographic minimum and the same tie-break (smallest k) as the plain loop.

Why the result is exact.  Let X* be the optimal bottleneck.  While U >= X*, every state on an
optimal (or tied) path has its true value <= U, its remaining units' time <= (stages left) * U, and
every candidate that reaches it within U survives the filters; so those states get their exact
(max, sum, arg) and the final answer equals the plain DP's.  U is not known beforehand: a first U
from a lower bound on X* (the total time spread evenly) grows until the program finds a partition
with bottleneck <= U (then U >= X*: exact).  A partition found above U is a real one, so its
bottleneck is a valid U for the next round.  The last round has U = inf, where nothing is pruned
except by seg's own infeasibility (memory floor) and domination: the plain program's answer,
infeasible included.  Segments priced in one round are cached by the evaluator for the next.
Checked equal to `partition_dp` on every configuration of several searches (tests/test_partition_bound.py)."""
from __future__ import annotations

import math

from ...pipeline.partition import backtrack_starts, partition_dp
from ...recompute.solver import POLICIES
from .numbers import gathered_params

# rounds of the upper bound, as multiples of the even-spread lower bound (then inf)
_ROUNDS = (1.02, 1.15, 1.5)


def partition_bounded(ev, n, p, cut_before):
    """Starts of the stages (list of p unit indices) or None: what
    `partition_dp(n, p, cut_before, ev.seg)[0]` returns, for p > 1."""
    tab = _floor_tables(ev)
    if not tab["tmono"]:
        return partition_dp(n, p, cut_before, ev.seg)[0]
    Tt = tab["t"]
    sc = [ev.send_floor(i) for i in range(p)]
    lb = (Tt[n] - Tt[0] + sum(sc)) / p
    if tab["mono"] and not _floor_reachable(ev, n, p, cut_before, tab):
        return None
    tried = set()
    for r in _ROUNDS + (math.inf,):
        U = lb * r
        while True:
            if U in tried:
                break
            tried.add(U)
            out, bott, exact = _solve(ev, n, p, cut_before, tab, sc, U)
            if out is not None and (exact or bott <= U):
                return out
            if out is None:
                if exact:          # nothing was pruned by U: infeasible for the plain program too
                    return None
                break
            U = bott               # a real partition: its bottleneck bounds X*; solve again under it
    return None


def _floor_tables(ev):
    """Prefix sums the bounds read: unit time (accumulated as the evaluator's own table, so `tfloor`
    is seg's exact starting expression); per unit, the states less the accumulators a stage may free
    before its peak plus FSDP2 ZeRO-2's gathered parameters (`numbers.gathered_params`, a sum over
    the stage's units); the least activations over the allowed choices.  `mono`: every unit adds
    >= 0 to the memory floor, so a longer segment's floor is never lower (the loops may stop early);
    `tmono`: every unit time >= 0 (the time floor grows with the segment; otherwise the plain
    program runs)."""
    store = getattr(ev, "_shared", None)       # (StageEvaluator: shared by the evaluators of one configuration)
    store = ev.__dict__ if store is None else store
    tab = store.get("_pb_tab")
    if tab is not None:
        return tab
    num, cfg = ev.num, ev.cfg
    tt, mem, act, mono = [0.0], [0.0], [0.0], True
    tmono = all(x >= 0 for x in num.t)
    for j, u in enumerate(ev.units):
        tt.append(tt[-1] + num.t[j])       # built as seg's own prefix table: the same floats
        x = num.states[j] - num.gacc[j] + gathered_params([u], [num.pbytes[j]], cfg)
        a = min(num.act[j][POLICIES.index(pol)] for pol in ev.allowed(u))
        mono = mono and x >= 0 and a >= 0
        mem.append(mem[-1] + x)
        act.append(act[-1] + a)
    tab = store["_pb_tab"] = {"t": tt, "mem": mem, "act": act, "mono": mono, "tmono": tmono}
    return tab


def _floor_reachable(ev, n, p, cut_before, tab):
    """Whether p stages can cover the units with every stage under the memory floor (False: no
    partition fits, seg need not be asked).  With monotone floors the best start for a stage ending
    at j is the latest end of the previous stage below j (its segment is the shortest): O(p n)."""
    M, A, infl, cap = tab["mem"], tab["act"], ev.infl, ev.cap
    ends = [j for j in range(1, n) if cut_before[j]] + [n]
    can = {0}
    for i in range(p):
        lim = cap * (1.0 + 1e-6 * max(1, infl[i]))
        nxt, k = set(), None
        for j in ([0] + ends):
            if k is not None and j > k and (j == n) == (i == p - 1):
                if (M[j] - M[k]) + infl[i] * (A[j] - A[k]) <= lim:
                    nxt.add(j)
            if j in can:
                k = j
        if not nxt:
            return False
        can = nxt
    return n in can


def _solve(ev, n, p, cut_before, tab, sc, U):
    """One round of the program under bottleneck bound U: (starts, bottleneck, exact) where `exact`
    says U pruned nothing (the answer, None included, is the plain program's)."""
    INF = math.inf
    Tt, M, A, mono = tab["t"], tab["mem"], tab["act"], tab["mono"]
    seg, cap, infl = ev.seg, ev.cap, ev.infl
    lo_t = 1.0 - 1e-9                       # bounds a hair low: pruning stays on the safe side
    mcap = [cap * (1.0 + 1e-6 * max(1, x)) for x in infl]
    slack = 1.0 + 1e-6
    ends = [j for j in range(1, n) if cut_before[j]]
    exact = True
    f0 = [[INF] * (n + 1) for _ in range(p)]
    f1 = [[INF] * (n + 1) for _ in range(p)]
    arg = [[None] * (n + 1) for _ in range(p)]
    for i in range(p):
        last = i == p - 1
        js = (n,) if last else ends
        left = p - 1 - i
        # (this stage's constants and the previous stage's rows in locals: the loops below are the
        # search's innermost; the same expressions, evaluated in the same order)
        sci, infli, mcapi = sc[i], infl[i], mcap[i]
        pf0, pf1 = (f0[i - 1], f1[i - 1]) if i > 0 else (None, None)
        for j in js:
            if not last and Tt[n] - Tt[j] > left * U * slack:
                exact = False              # the rest cannot fit in the stages left within U
                continue
            if i == 0:
                ks = (0,)
            else:
                ks = range(j - 1, 0, -1)
            cands = []
            Ttj, Mj, Aj = Tt[j], M[j], A[j]
            for k in ks:
                tf = ((Ttj - Tt[k]) + sci) * lo_t
                if tf > U:
                    exact = False
                    break                  # longer segments only take longer
                if i > 0:
                    if not cut_before[k]:
                        continue
                    prev0 = pf0[k]
                    if prev0 == INF:
                        continue
                    prev1 = pf1[k]
                else:
                    prev0 = prev1 = 0.0
                if (Mj - M[k]) + infli * (Aj - A[k]) > mcapi:
                    if mono:
                        break              # nor would any longer segment
                    continue               # seg would find it does not fit
                cands.append((max(prev0, tf), prev1 + tf, k, prev0, prev1))
            if not cands:
                continue
            cands.sort()
            b0 = b1 = INF
            bk = None
            for l0, l1, k, prev0, prev1 in cands:
                if (l0, l1, k) > (b0, b1, bk if bk is not None else INF):
                    break                  # this and every later bound are beaten already
                t, fits = seg(i, k, j)
                if not fits:
                    continue
                if i == 0:
                    c0, c1 = t, t
                else:
                    c0, c1 = max(prev0, t), prev1 + t
                if (c0, c1, k) < (b0, b1, bk if bk is not None else INF):
                    b0, b1, bk = c0, c1, k
            if bk is not None:
                f0[i][j], f1[i][j], arg[i][j] = b0, b1, bk
    if f0[p - 1][n] == INF:
        return None, INF, exact
    return backtrack_starts(arg, p, n), f0[p - 1][n], exact
