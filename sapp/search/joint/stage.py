"""Pricing of one pipeline stage (a run of units) under a configuration: time, memory, per-block
recomputation."""
from __future__ import annotations

import math

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

    def _tables(self):
        """Per-unit lists the summary path of `seg` slices (sums over slices add the same floats in
        the same order as the loop, so the results are identical)."""
        num = self.num
        isblock, fa, fe, pinned, tid, a0, keys, opts = [], [], [], [], [], [], {}, []
        for j, u in enumerate(self.units):
            al = self.allowed(u)
            isblock.append(u.kind == "block")
            a0.append(num.act[j][0] if u.kind == "block" else -math.inf)
            if len(al) == 1:
                k = POLICIES.index(al[0])
                fa.append(num.act[j][k])
                fe.append(num.extra[j][k])
                pinned.append(al[0] != "none")
                tid.append(None)
                continue
            fa.append(0.0)
            fe.append(0.0)
            pinned.append(False)
            key = (u.rep, al)
            if key not in keys:
                keys[key] = len(opts)
                opts.append((BlockOption(num.act[j], num.extra[j]), al))
            tid.append(keys[key])
        n = len(self.units)
        # prefix counts (blocks, pinned units, units of each type) and each type's next occurrence
        pb, pp_, pc = [0] * (n + 1), [0] * (n + 1), [[0] * (n + 1) for _ in opts]
        nxt = [[n] * (n + 1) for _ in opts]
        for j in range(n):
            pb[j + 1] = pb[j] + isblock[j]
            pp_[j + 1] = pp_[j] + pinned[j]
            for x in range(len(opts)):
                pc[x][j + 1] = pc[x][j] + (tid[j] == x)
        for j in range(n - 1, -1, -1):
            for x in range(len(opts)):
                nxt[x][j] = j if tid[j] == x else nxt[x][j + 1]
        self._tab = (pb, fa, fe, pp_, pc, nxt, a0, opts)
        return self._tab

    def _fast(self, i, a, b):
        """seg(i, a, b) without detail, from the per-unit tables."""
        pb, fa, fe, pinned, pc, nxt, a0, opts = getattr(self, "_tab", None) or self._tables()
        num, cap = self.num, self.cap
        if self.cfg.pp > 1 and pb[b] == pb[a]:
            return (math.inf, False)
        t = sum(num.t[a:b]) + self.sends(i) * self.c
        states = sum(num.states[a:b])
        z3 = max(num.pbytes[a:b], default=0.0) if self.cfg.zero == 3 else 0.0
        infl = self.infl[i]
        fixed_act, fixed_extra = sum(fa[a:b]), sum(fe[a:b])
        # the block types present, in order of first appearance (the loop's dict order)
        present = sorted((nxt[x][a], x) for x in range(len(opts)) if pc[x][b] > pc[x][a])
        tl = [[pc[x][b] - pc[x][a], opts[x][0], opts[x][1]] for _, x in present]
        free_act0 = sum(tv[0] * tv[1].act[0] for tv in tl)
        base = cap - states - z3
        if pinned[b] == pinned[a] and fixed_act + free_act0 <= base / infl + 1e-9 * cap:
            return (t + fixed_extra, True)
        m = max(a0[a:b], default=-math.inf)
        transient = m if m != -math.inf else 0.0
        budget = (base - transient) / infl - fixed_act
        if budget < 0:
            return (math.inf, False)
        if not tl:
            return (t + fixed_extra, True)
        if len(tl) == 1 and tl[0][2] == POLICIES:
            rc = choose_uniform(tl[0][0], tl[0][1], budget)
        elif all(tv[2] == POLICIES for tv in tl):
            rc = choose_recompute([(tv[0], tv[1]) for tv in tl], budget)
        else:
            rc = choose_restricted([tv + [[]] for tv in tl], budget)
        if rc is None:
            return (math.inf, False)
        return (t + (fixed_extra + rc.extra_s), True)

    def seg(self, i, a, b, detail=False):
        key = (i, a, b)
        if not detail and key in self.cache:
            return self.cache[key]
        if not detail:
            r = self.cache[key] = self._fast(i, a, b)
            return r
        num, cap = self.num, self.cap
        idx = range(a, b)
        if not any(self.units[j].kind == "block" for j in idx) and self.cfg.pp > 1:
            r = (math.inf, False) if not detail else None
            self.cache[key] = r
            return r
        t = sum(num.t[j] for j in idx) + self.sends(i) * self.c
        states = sum(num.states[j] for j in idx)
        z3 = max((num.pbytes[j] for j in idx), default=0.0) if self.cfg.zero == 3 else 0.0
        infl = self.infl[i]
        types, fixed_act, fixed_extra = {}, 0.0, 0.0
        for j in idx:
            u = self.units[j]
            al = self.allowed(u)
            if len(al) == 1:
                k = POLICIES.index(al[0])
                fixed_act += num.act[j][k]
                fixed_extra += num.extra[j][k]
                continue
            tk = (u.rep, al)
            if tk not in types:
                types[tk] = [0, BlockOption(num.act[j], num.extra[j]), al, []]
            types[tk][0] += 1
            types[tk][3].append(u.name)
        free_act0 = sum(tv[0] * tv[1].act[0] for tv in types.values())
        base = cap - states - z3
        choice, transient = None, 0.0
        # blocks pinned to selective/full recompute need the rematerialisation headroom regardless
        pinned = any(len(al) == 1 and al[0] != "none" for al in (self.allowed(self.units[j]) for j in idx))
        if not pinned and fixed_act + free_act0 <= base / infl + 1e-9 * cap:
            extra = fixed_extra
            acts = fixed_act + free_act0
            counts = [(tv[0], 0, 0) for tv in types.values()]
            choice = (acts, extra, counts)
        else:
            transient = max((num.act[j][0] for j in idx if self.units[j].kind == "block"), default=0.0)
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
            names = tv[3]
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
            for k2, v2 in held_states(self.units[j], self.cfg, self.ctx).items():
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
    recomputation where allowed)."""
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


def memory_floor(ctx, cfg, prof):
    """A lower bound on the device memory of the fullest stage under any partition and recompute
    choice: the stages together hold every unit's states and at least its smallest activations times
    the fewest micro-batches in flight on any stage, so the fullest holds at least 1/pp of that and at
    least its largest unit.  Above the capacity, the exact partition cannot fit (skipped: MoE models
    at scale otherwise spend most of the search proving configurations infeasible)."""
    ev = StageEvaluator(ctx, cfg, prof)
    num, infl = ev.num, min(ev.infl)
    per = [num.states[j] + infl * min(num.act[j][POLICIES.index(x)] for x in ev.allowed(u))
           for j, u in enumerate(ev.units)]
    return max(sum(per) / cfg.pp, max(per, default=0.0))
