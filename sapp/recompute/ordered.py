"""Exact recompute choice for one run of identical blocks, priced with the transient of its best
block order rather than a bound over every order.

At block j's backward the stage holds, above its stashed activations, what j rematerialises
(selective: the attention core's tensors, a0 - a1; full: the whole block, a0 - a2) less the stashes
of the units after j, already freed (search/joint/stage.py `transient`).  For every policy p the
rematerialised bytes plus the stash are a0 (none: 0 + a0), so swapping two neighbouring blocks
changes only which of them sits later, and putting the one that rematerialises more earlier is never
worse: the best order of a run is full blocks first, then selective, then none, front to back.  Along
each policy's sub-run a block's term is linear in its position (ZeRO-3 gathers grow by a block's
parameters per block towards the front; the front block, with nothing prefetched, is off that line and
taken apart), so its largest term is at one end: the transient of a count choice is O(1), and the least-extra choice is exact over every per-block assignment of the run
(checked by brute force in tests/test_joint_exhaustive.py)."""
from __future__ import annotations

import math

from .solver import BlockOption, RecomputeChoice


def ordered_transient(counts, opt: BlockOption, post_stash, post_term, pre_term, g_last=0.0, dg=0.0,
                      g_front=None):
    """(transient, run stash) of a run ordered full, selective, none (front to back) with counts
    (n_none, n_selective, n_full).  post_stash / post_term: stash of the units after the run and the
    largest of their own terms; pre_term: the largest term of the units before it, less the stash of
    the run and what follows; g_last / dg: ZeRO-3 bytes gathered at the run's last block's backward
    and their growth per block towards the front; g_front: the front block's, when it is off that
    line (FSDP2 prefetches nothing during a stage's first block's backward)."""
    a = opt.act
    k = sum(counts)
    after, q, worst = post_stash, 0, max(0.0, post_term)

    def gathered(j):
        return g_front if g_front is not None and j == k - 1 else g_last + j * dg
    for c, p in zip(counts, (0, 1, 2)):       # walked from the back: none, selective, full
        if not c:
            continue
        r, s = a[0] - a[p], a[p]
        # a term is linear in the position along the sub-run but for the front block: its ends, and
        # the block behind the front one
        ends = {q, q + c - 1} | ({q + c - 2} if g_front is not None and q + c - 1 == k - 1 and c > 1 else set())
        worst = max([worst] + [r + gathered(j) - after - (j - q) * s for j in ends])
        after += c * s
        q += c
    return max(worst, pre_term - after), after - post_stash


def choose_ordered(k, opt: BlockOption, allowed, limit, infl, fixed_act, post_stash=0.0, post_term=-math.inf,
                   pre_term=-math.inf, g_last=0.0, dg=0.0, tol=0.0, g_front=None):
    """Least-extra (n_none, n_selective, n_full) for k identical blocks in a row such that
    infl * (fixed_act + run stash) + transient <= limit + tol, or None.  For each number of full
    blocks the least number of selective ones that fits (memory does not grow with each selective
    block: the stash falls by infl * (a0 - a1), the transient rises by at most a0 - a1), found by
    stepping up from the least count whose stash alone fits."""
    e = opt.extra
    a0, a1, a2 = opt.act
    lim = limit + tol
    has_none, has_sel, has_full = "none" in allowed, "selective" in allowed, "full" in allowed

    def fits(nn, ns, nf):
        tr, stash = ordered_transient((nn, ns, nf), opt, post_stash, post_term, pre_term, g_last, dg, g_front)
        return infl * (fixed_act + stash) + tr <= lim

    best = None
    nf0 = 0
    if has_full and a1 > a2 and infl * (fixed_act + k * a1) > lim:
        # fewer full blocks cannot fit even with every other block selective (stash alone)
        nf0 = min(k, max(0, math.floor((infl * (fixed_act + k * a1) - lim) / (infl * (a1 - a2))) - 1))
    for nf in (range(nf0, k + 1) if has_full else (0,)):
        if best is not None and nf * e[2] >= best.extra_s:
            break                      # extra only grows with more full blocks from here
        rest = k - nf
        if has_none and has_sel:
            # from the least ns whose stash alone fits (the transient is >= 0) upwards: a few steps,
            # the transient being about one block's activations
            over = infl * (fixed_act + rest * a0 + nf * a2) - lim
            if over <= 0:
                ns = 0
            elif a0 > a1:
                ns = max(0, math.ceil(over / (infl * (a0 - a1))) - 1)
            else:
                continue
            while ns <= rest and not fits(rest - ns, ns, nf):
                if best is not None and (rest - ns) * e[0] + ns * e[1] + nf * e[2] >= best.extra_s:
                    ns = rest + 1              # (extra grows with ns) cannot beat the best any more
                    break
                ns += 1
            if ns > rest:
                continue
        elif has_sel:
            ns = rest
        elif has_none:
            ns = 0
        elif rest:
            continue
        else:
            ns = 0
        if not fits(rest - ns, ns, nf):
            continue
        ext = (rest - ns) * e[0] + ns * e[1] + nf * e[2]
        if best is None or ext < best.extra_s - 1e-15:
            _, stash = ordered_transient((rest - ns, ns, nf), opt, post_stash, post_term, pre_term, g_last, dg,
                                         g_front)
            best = RecomputeChoice(stash, ext, ((rest - ns, ns, nf),))
    return best
