"""Pricing of one pipeline stage (a run of units) under a configuration: time, memory, per-block
recomputation."""
from __future__ import annotations

import math
from bisect import bisect_left

from ...pipeline.schedule import in_flight
from ...recompute.solver import POLICIES, BlockOption, choose_recompute, choose_uniform
from .numbers import held_states, p2p_time, unit_numbers
from .result import StageResult


class StageEvaluator:
    """Prices stages of one configuration; `seg(i, a, b)` for units [a, b) as stage i."""

    def __init__(self, ctx, cfg, prof, policy=None, cap_extra=0.0):
        self.ctx, self.cfg, self.prof = ctx, cfg, prof
        self.cap = ctx.cap + cap_extra
        self.num = unit_numbers(ctx, prof, cfg)
        self.n = len(prof.units)
        self.units = prof.units
        self.c = p2p_time(ctx, cfg, self.num.boundary)
        self.infl = in_flight(cfg.schedule, cfg.pp, cfg.m, cfg.v)
        self.policy = policy       # force one policy for every block (exhaustive benchmark)
        self.cache = {}
        # units with the same numbers (UnitNumbers' key: a block's type, a glue unit's name) and the
        # same allowed policies form a class; seg() adds classes up by their counts in a range
        ckey = (id(prof), policy)
        cache = ctx.__dict__.setdefault("_unit_classes", {})
        if ckey not in cache:
            classes = {}
            for j, u in enumerate(self.units):
                classes.setdefault((u.rep if u.kind == "block" else u.name, self.allowed(u)), []).append(j)
            cache[ckey] = (prof, list(classes.items()))      # (prof kept alive: its id stays unique)
        self.classes = cache[ckey][1]

    def allowed(self, u):
        if u.kind != "block":
            return ("none",)
        if self.policy is not None:
            return (self.policy,)
        return self.ctx.allowed(u.name)

    def sends(self, i):
        p = self.cfg.pp
        s = (1 if i < p - 1 else 0) + (1 if i > 0 else 0)
        if self.cfg.schedule == "interleaved":
            s = 2 * self.cfg.v - (1 if i == p - 1 else 0) - (1 if i == 0 else 0)
        return s

    def seg(self, i, a, b, detail=False):
        key = (i, a, b)
        if not detail and key in self.cache:
            return self.cache[key]
        num, cap = self.num, self.cap
        idx = range(a, b)
        # the classes of units present in [a, b), in order of first appearance, with their counts:
        # a stage's sums are over classes (a few), not units (up to hundreds of blocks)
        present = []
        for (ukey, al), pos in self.classes:
            lo = bisect_left(pos, a)
            if lo < len(pos) and pos[lo] < b:
                present.append((pos[lo], bisect_left(pos, b, lo) - lo, al, lo))
        present.sort()
        is_block = [self.units[j0].kind == "block" for j0, _, _, _ in present]
        if not any(is_block) and self.cfg.pp > 1:
            r = (math.inf, False) if not detail else None
            self.cache[key] = r
            return r
        t = sum(cnt * num.t[j0] for j0, cnt, _, _ in present) + self.sends(i) * self.c
        states = sum(cnt * num.states[j0] for j0, cnt, _, _ in present)
        z3 = max((num.pbytes[j0] for j0, _, _, _ in present), default=0.0) if self.cfg.zero == 3 else 0.0
        infl = self.infl[i]
        types, fixed_act, fixed_extra = {}, 0.0, 0.0
        for j0, cnt, al, _ in present:
            if len(al) == 1:
                k = POLICIES.index(al[0])
                fixed_act += cnt * num.act[j0][k]
                fixed_extra += cnt * num.extra[j0][k]
                continue
            # (unit names filled in below, for the detailed result only)
            types[(self.units[j0].rep, al)] = [cnt, BlockOption(num.act[j0], num.extra[j0]), al, j0]
        free_act0 = sum(tv[0] * tv[1].act[0] for tv in types.values())
        base = cap - states - z3
        choice, transient = None, 0.0
        # blocks pinned to selective/full recompute need the rematerialisation headroom regardless
        pinned = any(len(al) == 1 and al[0] != "none" for _, _, al, _ in present)
        if not pinned and fixed_act + free_act0 <= base / infl + 1e-9 * cap:
            extra = fixed_extra
            acts = fixed_act + free_act0
            counts = [(tv[0], 0, 0) for tv in types.values()]
            choice = (acts, extra, counts)
        else:
            transient = max((num.act[j0][0] for (j0, _, _, _), blk in zip(present, is_block) if blk), default=0.0)
            budget = (base - transient) / infl - fixed_act
            if budget >= 0:
                tl = list(types.values())
                if len(tl) == 1 and tl[0][2] == POLICIES:
                    rc = choose_uniform(tl[0][0], tl[0][1], budget)
                elif not tl:
                    rc = None
                    choice = (fixed_act, fixed_extra, [])
                else:
                    rc = choose_recompute([(tv[0], tv[1]) for tv in tl], budget) if all(
                        tv[2] == POLICIES for tv in tl) else choose_restricted(tl, budget)
                if rc is not None:
                    choice = (fixed_act + rc.act_bytes, fixed_extra + rc.extra_s, list(rc.counts))
        if choice is None:
            r = (math.inf, False) if not detail else None
            self.cache[key] = r
            return r
        acts, extra, counts = choice
        T = t + extra
        if not detail:
            self.cache[key] = (T, True)
            return (T, True)
        # detailed: per-block policies (recompute the last blocks of each type first: deterministic)
        policies = {}
        for (tv, cnt) in zip(types.values(), counts):
            tk = (self.units[tv[3]].rep, tv[2])
            names = [self.units[j].name for j in idx
                     if self.units[j].kind == "block" and (self.units[j].rep, self.allowed(self.units[j])) == tk]
            nn, ns, nf = cnt
            for q, name in enumerate(names):
                policies[name] = "none" if q < nn else ("selective" if q < nn + ns else "full")
        for j in idx:
            u = self.units[j]
            al = self.allowed(u)
            if u.kind == "block" and len(al) == 1:
                policies[u.name] = al[0]
        st = {"params": 0.0, "grads": 0.0, "optimizer": 0.0}
        for j in idx:
            for k2, v2 in held_states(self.units[j], self.cfg).items():
                st[k2] += v2
        fwd = sum(num.fwd[j] for j in idx)
        return StageResult(
            index=i, units=[self.units[j].name for j in idx],
            blocks=[self.units[j].name for j in idx if self.units[j].kind == "block"],
            fwd_s=fwd, bwd_s=t - self.sends(i) * self.c - fwd + extra, recompute_s=extra,
            send_s=self.sends(i) * self.c,
            grad_sync_s=sum(num.gs[j] for j in idx) + max((num.lat[j] for j in idx), default=0.0), in_flight=infl,
            memory={"params": st["params"], "grads": st["grads"], "optimizer": st["optimizer"],
                    "activations": acts * infl, "transient": transient + z3},
            recompute=policies, param_tensors=sum(self.units[j].tensors for j in idx))


def choose_restricted(types, budget):
    """Recompute choice when some block types may only use a subset of the policies."""
    from ...recompute.solver import RecomputeChoice, _pareto, _type_frontier
    cur = [(0.0, 0.0, ())]
    for n, opt, al, _ in types:
        f = _type_frontier(n, opt, al)
        cur = _pareto([(a1 + a2, e1 + e2, c1 + (c2,)) for a1, e1, c1 in cur for a2, e2, c2 in f])
    best = None
    for act, ext, counts in cur:
        if act <= budget * (1 + 1e-12) and (best is None or ext < best.extra_s):
            best = RecomputeChoice(act, ext, counts)
    return best


def memory_needed(ctx, cfg, prof):
    """Least per-device memory with which this configuration would fit (even split, full
    recomputation where allowed).  Cached per configuration for the search."""
    cache = ctx.__dict__.setdefault("_memory_needed", {})
    key = (cfg, id(prof))
    if key not in cache:
        cache[key] = (_memory_needed(ctx, cfg, prof), prof)
    return cache[key][0]


def _memory_needed(ctx, cfg, prof):
    ev = StageEvaluator(ctx, cfg, prof)
    num = ev.num
    p, n = cfg.pp, ev.n
    per = math.ceil(ctx.L / p) if ctx.L else 0
    worst = 0.0
    blocks = [j for j, u in enumerate(ev.units) if u.kind == "block"]
    for i in range(p):
        if p == 1:
            idx = range(n)
        else:
            bl = blocks[i * per:(i + 1) * per]
            if not bl:
                continue
            a = 0 if i == 0 else bl[0]
            b = n if i == p - 1 else bl[-1] + 1
            idx = range(a, b)
        st = sum(num.states[j] for j in idx)
        act = 0.0
        for j in idx:
            al = ev.allowed(ev.units[j])
            act += min(num.act[j][POLICIES.index(x)] for x in al)
        tr = max((num.act[j][0] for j in idx if ev.units[j].kind == "block"), default=0.0)
        worst = max(worst, st + act * ev.infl[i] + tr)
    return worst
