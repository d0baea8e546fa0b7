"""The exact per-block recomputation mix of one pipeline stage, for the exhaustive reference
(bench/joint_exhaustive.py): independent of the search's solver, and checked against brute force.

The search (sapp/search/joint/stage.py) picks per block type how many blocks take none / selective /
full recomputation, against a budget that holds the largest transient any choice could need.  The
reference here is the optimum over every per-block assignment under the same memory rule the
search's stage result reports:

    states + ZeRO-2 gathers + in_flight * sum(stash_j) + transient(assignment) <= capacity,
    transient = max(0, max_j (remat_j + gathered_j - stash of the units after j))   (stage.transient)

(an interleaved last stage's head + loss count once, not in_flight times: stage.tail_act)

minimising the recomputation seconds sum(extra_j).  It walks the stage's units from the last to the
first keeping (extra, stash after, worst term) states; a state is dropped when another has no more
extra, no more stash and no more worst + stash.  That drop is exact whenever at least one
micro-batch is in flight: whatever units come before, the kept state's final memory is at most the
dropped one's (each later term is higher by the stash difference d at most, the activations lower by
in_flight * d).  `brute_force_stage` enumerates every assignment for the tests."""
from __future__ import annotations

import itertools
import math
from bisect import bisect_right

from sapp.recompute.solver import POLICIES
from sapp.search.joint.numbers import held_states
from sapp.search.joint.result import StageResult
from sapp.search.joint.stage import StageEvaluator

MIXES = [0]        # states (partial per-block assignments) scored, for the benchmark's report


class ExactStageEvaluator(StageEvaluator):
    """StageEvaluator whose `seg` prices a stage with the exact best per-block recompute mix."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        num = self.num
        # a frontier depends only on what its units are (their numbers, shared by every configuration
        # with the same profile, micro-batch size and ZeRO stage; the ZeRO-3 gather rule; the allowed
        # policies), not on the stage index, the capacity or which blocks they are: cached on the
        # search context by that content, so every run of k identical blocks is walked once
        zmode = (self.cfg.zero == 3, self.cfg.pp > 1 and self.cfg.m > 1)
        store = self.ctx.__dict__.setdefault("_exact_frontiers", {})
        self._fr = store.setdefault((id(num), zmode, self.policy), {})
        self._sigs = tuple((u.rep if u.kind == "block" else u.name, u.kind, self.allowed(u)) for u in self.units)
        self._pre_t = _prefix(num.t)
        self._pre_st = _prefix(num.states)
        self._pre_gacc = _prefix(num.gacc)
        self._pre_pb = _prefix(num.pbytes)
        self._pre_root = _prefix([pb if u.kind != "block" else 0.0 for u, pb in zip(self.units, num.pbytes)])
        self._pre_bpb = _prefix([pb if u.kind == "block" else 0.0 for u, pb in zip(self.units, num.pbytes)])
        self._pre_blocks = _prefix([u.kind == "block" for u in self.units])
        # nearest block before each unit (-1: none), for FSDP2's backward prefetch (numbers._prefetched)
        self._prevb, last = [], -1
        for j, u in enumerate(self.units):
            self._prevb.append(last)
            if u.kind == "block":
                last = j

    def _flag(self, j, a):
        """Bytes of the block before unit j inside the stage starting at a (0 when none): what FSDP2's
        backward prefetch holds while j's backward runs, if j is a block or the glue after the last one."""
        if self.cfg.zero != 3 or self._prevb[j] < a:
            return 0.0
        return self.num.pbytes[self._prevb[j]]

    def _prefetch(self, j, a, b):
        if self.units[j].kind == "block" or self._pre_blocks[b] == self._pre_blocks[j + 1]:
            return self._flag(j, a)
        return 0.0

    def _gathered(self, j, held):
        """ZeRO-3 bytes gathered at unit j's backward beyond the stage's root (numbers.zero3_gathered)."""
        if self.cfg.zero != 3:
            return 0.0
        u = self.units[j]
        # and, under a torchtitan profile, FSDP2's buffers beside a block's gathered parameters (`held`)
        own = self.num.pbytes[j] * self.num.fsdp_held if u.kind == "block" else 0.0
        if self.cfg.pp > 1 and self.cfg.m > 1:
            return held + own
        return self.num.pbytes[j] + own if u.kind == "block" else 0.0

    def frontier(self, a, b):
        """States [(extra, stash, worst, chain)] of units [a, b) walked from b down to a; chain links
        (units from b, policy, rest).  Resumes from the longest cached suffix of the same content."""
        sigs = self._sigs
        # a suffix's terms depend on its content and on the block before it inside the stage (the
        # prefetch of its leading units): both are the cache key
        got = self._fr.get((sigs[a:b], self._flag(a, a)))
        if got is not None:
            return got
        j0 = a + 1
        while j0 < b and (sigs[j0:b], self._flag(j0, a)) not in self._fr:
            j0 += 1
        states = self._fr[(sigs[j0:b], self._flag(j0, a))] if j0 < b else [(0.0, 0.0, -math.inf, None)]
        held = self._pre_bpb[b] - self._pre_bpb[j0]
        num = self.num
        for j in range(j0 - 1, a - 1, -1):
            u = self.units[j]
            act, ext = num.act[j], num.extra[j]
            if u.kind == "block":
                held += num.pbytes[j]
            g = self._gathered(j, held) + self._prefetch(j, a, b)
            out = []
            for p in self.allowed(u):
                k = POLICIES.index(p)
                # a glue unit's backward holds `live` beyond its stash (a loss's gradients, UnitNumbers.live)
                rc = act[0] - act[k] if (u.kind == "block" and p != "none") else (
                    num.live[j] if u.kind != "block" else 0.0)
                for e, s, w, chain in states:
                    out.append((e + ext[k], s + act[k], max(w, rc + g - s), (b - j, p, chain)))
            MIXES[0] += len(out)
            states = _prune(out)
            self._fr[(sigs[j:b], self._flag(j, a))] = states
        return states

    def _pick(self, i, a, b):
        """(stage seconds, extra, stash, transient, chain) of the fastest fitting mix, or None."""
        if self.cfg.pp > 1 and self._pre_blocks[b] == self._pre_blocks[a]:
            return None
        infl = self.infl[i]
        assert infl >= 1.0, "the dominance drop needs at least one micro-batch in flight"
        acc = self.cfg.m > infl
        states = (self._pre_st[b] - self._pre_st[a]) - (0.0 if acc else self._pre_gacc[b] - self._pre_gacc[a])
        z3 = (self._pre_pb[b] - self._pre_pb[a]) if self.cfg.zero == 2 else 0.0
        root = (self._pre_root[b] - self._pre_root[a]) if self.cfg.zero == 3 else 0.0
        tail = self.tail_act(i, a, b)
        base = self.cap - states - z3 - tail
        best = None
        for e, s, w, chain in self.frontier(a, b):
            tr = max(0.0, root + w)
            if infl * (s - tail) + tr <= base + 1e-9 * self.cap and (best is None or e < best[0]):
                best = (e, s, tr, chain)
        if best is None:
            return None
        t = (self._pre_t[b] - self._pre_t[a]) + self.send_s(i, a, b) + self.num.prefetch_edges(a, b)
        return (t + best[0],) + best

    def seg(self, i, a, b, detail=False):
        key = (i, a, b)
        if not detail and key in self.cache:
            return self.cache[key]
        got = self._pick(i, a, b)
        if not detail:
            r = (math.inf, False) if got is None else (got[0], True)
            self.cache[key] = r
            return r
        if got is None:
            return None
        T, extra, stash, tr, chain = got
        policies = {}
        while chain is not None:
            off, p, chain = chain
            if self.units[b - off].kind == "block":
                policies[self.units[b - off].name] = p
        idx = range(a, b)
        # the walk's transient equals the search's own rule for the same assignment
        check = self.transient(idx, policies)
        assert abs(check - tr) <= 1e-6 * max(1.0, abs(tr)), (check, tr)
        acc = self.cfg.m > self.infl[i]
        z3 = (self._pre_pb[b] - self._pre_pb[a]) if self.cfg.zero == 2 else 0.0
        st = {"params": 0.0, "grads": 0.0, "optimizer": 0.0}
        for j in idx:
            for k2, v2 in held_states(self.units[j], self.cfg, acc, self.ctx).items():
                st[k2] += v2
        fwd = sum(self.num.fwd[j] for j in idx)
        send = self.send_s(i, a, b)
        return StageResult(
            index=i, units=[self.units[j].name for j in idx],
            blocks=[self.units[j].name for j in idx if self.units[j].kind == "block"],
            fwd_s=fwd, bwd_s=T - send - fwd, recompute_s=extra, send_s=send,
            grad_sync_s=sum(self.num.gs[j] for j in idx) + max((self.num.lat[j] for j in idx), default=0.0),
            in_flight=self.infl[i],
            memory={"params": st["params"], "grads": st["grads"], "optimizer": st["optimizer"],
                    "activations": (stash - self.tail_act(i, a, b)) * self.infl[i] + self.tail_act(i, a, b),
                    "transient": tr + z3},
            recompute=policies, param_tensors=sum(self.units[j].tensors for j in idx))


def _prefix(xs):
    out = [0.0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def _prune(states):
    """Drop every state another one dominates (no more extra, stash and worst + stash): in extra order,
    against the 2-d staircase of (stash, worst + stash) of the states kept so far (stash ascending,
    worst + stash strictly descending, so the entry at or below a stash holds the least worst + stash)."""
    states.sort(key=lambda q: (q[0], q[1], q[2] + q[1]))
    kept, xs, ys = [], [], []
    for q in states:
        s, ws = q[1], q[2] + q[1]
        k = bisect_right(xs, s)
        if k and ys[k - 1] <= ws:
            continue
        kept.append(q)
        hi = k
        while hi < len(xs) and ys[hi] >= ws:
            hi += 1
        xs[k:hi] = [s]
        ys[k:hi] = [ws]
    return kept


def brute_force_stage(ev, i, a, b):
    """Every per-block assignment of stage [a, b) priced with the search's own memory rule
    (ev.transient and the units' stashes): (least extra seconds that fits, its policies) or None."""
    units = [ev.units[j] for j in range(a, b)]
    blocks = [u for u in units if u.kind == "block"]
    num, infl = ev.num, ev.infl[i]
    acc = ev.cfg.m > infl
    states = sum(num.states[j] for j in range(a, b)) - (0.0 if acc else sum(num.gacc[j] for j in range(a, b)))
    z3 = sum(num.pbytes[j] for j in range(a, b)) if ev.cfg.zero == 2 else 0.0
    pos = {u.name: j for j, u in zip(range(a, b), units)}
    best = None
    for combo in itertools.product(*(ev.allowed(u) for u in blocks)):
        pols = dict(zip((u.name for u in blocks), combo))
        stash = sum(num.act[j][POLICIES.index(pols.get(u.name, "none"))] for j, u in zip(range(a, b), units))
        extra = sum(num.extra[pos[n]][POLICIES.index(p)] for n, p in pols.items())
        tail = ev.tail_act(i, a, b)
        mem = states + z3 + infl * (stash - tail) + tail + ev.transient(range(a, b), pols)
        if mem <= ev.cap * (1 + 1e-9) and (best is None or extra < best[0] - 1e-15):
            best = (extra, pols)
    return best


class exact_evaluator:
    """Context manager: price_config builds ExactStageEvaluator instead of the search's StageEvaluator
    (the search's memory bounds and placement weighing stay as they are)."""

    def __enter__(self):
        import sapp.search.joint.evaluate as ev_mod
        self._mod, self._old = ev_mod, ev_mod.StageEvaluator
        ev_mod.StageEvaluator = ExactStageEvaluator
        return self

    def __exit__(self, *exc):
        self._mod.StageEvaluator = self._old
        return False
