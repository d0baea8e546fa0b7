"""Pricing of one pipeline stage (a run of units) under a configuration: time, memory, per-block
recomputation."""
from __future__ import annotations

import functools
import math
from bisect import bisect_left

from ...pipeline.dualpipe import stage_peak
from ...pipeline.partition import chunk_counts, stage_end
from ...pipeline.schedule import chunk_peak as _chunk_peak, in_flight
from ...recompute.ordered import choose_ordered
from ...recompute.solver import POLICIES, BlockOption, choose_recompute, choose_uniform
from .copies import copy_bytes, copy_states, weight_copies
from .numbers import boundary_sends, held_states, unit_numbers, zero3_gathered
from .result import StageResult

MIXED_BLOCKS = 24       # stages with several block types and at most this many free blocks: see _mixed


@functools.lru_cache(maxsize=4096)
def chunk_peak(p, m, v, i, blocks):
    """schedule.chunk_peak memoised (the bounds and the partition ask it over and over); `blocks`: a tuple."""
    return _chunk_peak(p, m, v, i, blocks)


def stage_in_flight(cfg, infl, i, k):
    """Micro-batches in flight on stage i holding k blocks, in whole-stage units: `infl[i]`
    (schedule.in_flight), or for interleaved chunks of unequal size each chunk's live forwards weighed
    by its blocks (schedule.chunk_in_flight; Llama 3's blockless end chunks, chunks of 1 and 2 blocks)."""
    got = unequal_chunks(cfg, i, k)
    return infl[i] if got is None else chunk_peak(cfg.pp, cfg.m, cfg.v, i, got)[0]


def unequal_chunks(cfg, i, k):
    """The block counts of stage i's v chunks when they differ (interleaved, k blocks), else None."""
    if cfg.schedule != "interleaved" or cfg.v < 2 or k < 1:
        return None
    return _unequal(cfg.v, cfg.pp, i, k)


@functools.lru_cache(maxsize=4096)
def _unequal(v, p, i, k):
    """unequal_chunks of an interleaved schedule, memoised (asked per stage and block count over and over)."""
    try:
        ch = chunk_counts(int(round(k)), v, stage_end(i, p))
    except ValueError:          # fewer blocks than chunks: no layout (the partition never asks)
        return None
    return None if min(ch) == max(ch) else tuple(ch)


class StageEvaluator:
    """Prices stages of one configuration; `seg(i, a, b)` for units [a, b) as stage i."""

    def __init__(self, ctx, cfg, prof, policy=None, cap_extra=0.0):
        self.ctx, self.cfg, self.prof = ctx, cfg, prof
        self.cap = ctx.cap + cap_extra
        self.num = unit_numbers(ctx, prof, cfg)
        self.n = len(prof.units)
        self.units = prof.units
        self.infl = in_flight(cfg.schedule, cfg.pp, cfg.m, cfg.v)
        self.policy = policy       # force one policy for every block (exhaustive benchmark)
        self.cache = {}
        # what does not depend on the capacity (the prefix tables, the sends, the transient tables) is
        # shared by the evaluators of one configuration: the device pricing, each host placement's
        # re-pricing (cap_extra), the memory bounds
        memo = ctx.__dict__.setdefault("_stage_shared", {})
        key = (cfg, id(prof), policy)
        got = memo.get(key)
        if got is None or got[0] is not prof:
            got = memo[key] = (prof, {})
        self._shared = got[1]
        self._tab = self._shared.get("tab")

    @functools.cached_property
    def tx(self):
        """The sends at every cut (numbers.boundary_sends), built on first use: the memory bounds
        (memory_floor, memory_needed) build an evaluator and never send."""
        got = self._shared.get("tx")
        if got is None:
            got = self._shared["tx"] = boundary_sends(self.ctx, self.cfg, self.num)
        return got

    @property
    def copies(self):
        """copies.weight_copies of this configuration (shared by its evaluators)."""
        got = self._shared.get("copies")
        if got is None:
            got = self._shared["copies"] = weight_copies(self.ctx, self.cfg, self.prof)
        return got

    @property
    def sg(self):
        """Whether the sends use Megatron's scatter/gather."""
        return self.tx.sg

    def chunk_accumulators(self, i, a, b, ch):
        """Interleaved chunks of unequal size `ch` (unequal_chunks): per unit of [a, b), whether its chunk
        already ran a backward at the stage's activation peak (its FSDP2 accumulators are then alive:
        held_states).  The prologue sits in chunk 0, the epilogue in chunk v - 1, the blocks in order."""
        units = self.units
        seen = chunk_peak(self.cfg.pp, self.cfg.m, self.cfg.v, i, ch)[1]
        owner = [c for c, n in enumerate(ch) for _ in range(n)]
        out, r = [], 0
        for j in range(a, b):
            if units[j].kind == "block":
                out.append(seen[owner[r]])
                r += 1
            else:
                out.append(seen[0] if r == 0 else seen[-1])
        return out

    @functools.cached_property
    def v_tail(self):
        """DualPipeV: the first unit after the last block, or None.  The head and loss run on rank 0 (the
        V's last stage, a module of its own: a weight tied to the embedding is a copy there), not rank p - 1."""
        if self.cfg.schedule != "dualpipev":
            return None
        e = 1 + max((j for j, u in enumerate(self.units) if u.kind == "block"), default=self.n)
        return e if e < self.n else None

    def device_units(self, i, a, b):
        """The units device i holds for the run [a, b): dualpipev moves the tail (v_tail) to rank 0."""
        e = self.v_tail
        if e is not None and i == self.cfg.pp - 1 and b > e:
            return range(a, e)
        return [*range(a, b), *range(e, self.n)] if e is not None and i == 0 and b <= e else range(a, b)

    def allowed(self, u):
        if u.kind != "block":
            return ("none",)
        if self.policy is not None:
            return (self.policy,)
        return self.ctx.allowed(u.name)

    def send_counts(self, i):
        """(forward, backward) sends of device i per micro-batch: activations to the next stage,
        gradients to the one before (every interleaved chunk boundary is one, except the model's ends)."""
        p = self.cfg.pp
        if self.cfg.schedule == "dualpipev":
            # the V: device i holds stages i and 2p-1-i; stage p-1 hands stage p its output on the same
            # device (and its gradient back), the model's last stage is device 0's
            n = 2 - (i == 0) - (i == p - 1)
            return n, n
        v = self.cfg.v if self.cfg.schedule == "interleaved" else 1
        return v - (1 if i == p - 1 else 0), v - (1 if i == 0 else 0)

    def sends(self, i):
        return sum(self.send_counts(i))

    def send_pair(self, i, a=None, b=None):
        """((seconds, bytes) of one forward send, of one backward send) of device i as the stage of
        units [a, b): its activations after unit b-1, its input gradients to the stage ending with
        unit a-1.  Interleaved / DualPipeV chunks (or no units given): the largest cut's."""
        tx = self.tx
        if a is None or self.cfg.schedule in ("interleaved", "dualpipev"):
            return tx.fmax, tx.bmax
        return tx.f.get(b - 1, tx.fmax), tx.b.get(a - 1, tx.bmax)

    def send_s(self, i, a=None, b=None):
        """Seconds device i spends sending per micro-batch (charged to the sender)."""
        (nf, nb), (f, g) = self.send_counts(i), self.send_pair(i, a, b)
        return nf * f[0] + nb * g[0]

    def send_bytes_of(self, i, a, b):
        """(forward, backward) bytes of one of device i's sends each way, as send_s prices them."""
        (nf, nb), (f, g) = self.send_counts(i), self.send_pair(i, a, b)
        return (f[1] if nf else 0.0), (g[1] if nb else 0.0)

    def send_floor(self, i):
        """A lower bound on send_s(i, a, b) over every stage i may be (partition_bound)."""
        nf, nb = self.send_counts(i)
        return nf * self.tx.fmin[0] + nb * self.tx.bmin[0]

    def transient(self, idx, policies, no_full=False):
        """Bytes above the stage's stashed activations while its backward runs: at unit j's backward
        (block j recomputed first, if it is), what j stashed, what its recomputation saves again and
        (plain ZeRO-3) the parameters gathered for it are alive, while the stashes of every unit after
        j (later blocks, the head and loss) are already freed:
        max(0, max_j (rematerialised_j + gathered_j - stash after j)); a glue unit's rematerialised
        bytes are what its backward holds beyond its stash (`UnitNumbers.live`: a loss's gradients).  Recomputed again: selective,
        the attention core's saved tensors (act none - act selective); full, the whole block's beside
        its kept input (none - full).  `policies` None: the most any allowed choice could need (each
        block at its largest rematerialisation, stashing its least; `no_full`: free blocks not full)."""
        if policies is None and self.cfg.zero != 3 and isinstance(idx, range) and idx.step == 1:
            return self._transient_any(idx.start, idx.stop, no_full)
        num, worst, after = self.num, 0.0, 0.0
        gath = zero3_gathered([self.units[j] for j in idx], [num.pbytes[j] for j in idx], self.cfg,
                              self.num.fsdp_held)
        for q in range(len(idx) - 1, -1, -1):
            j = idx[q]
            u = self.units[j]
            act = num.act[j]
            g = gath[q] if gath else 0.0
            if u.kind != "block":
                worst = max(worst, g + num.live[j] - after)
                after += act[0]
                continue
            al = self.allowed(u) if policies is None else (policies.get(u.name, "none"),)
            if no_full and len(al) > 1:
                al = tuple(p for p in al if p != "full")
            rc = max((act[0] - act[POLICIES.index(p)] for p in al if p != "none"), default=0.0)
            worst = max(worst, rc + g - after)
            after += min(act[POLICIES.index(p)] for p in al)
        return worst

    def _tables(self):
        """Prefix sums over the units (time, states, accumulators, gathered bytes, the fixed-policy
        units' activations and recompute time, blocks, pinned blocks) and each free block type's unit
        positions: `seg` prices any run [a, b) from them without walking its units (it is asked for
        every run the exact partition tries)."""
        num = self.num
        keys = ("t", "states", "gacc", "pbytes", "fact", "fext", "blocks", "pinned")
        T = {k: [0.0] for k in keys}
        T["classes"] = {}
        for j, u in enumerate(self.units):
            al = self.allowed(u)
            fixed = len(al) == 1
            k = POLICIES.index(al[0]) if fixed else None
            for name, v in (("t", num.t[j]), ("states", num.states[j]), ("gacc", num.gacc[j]),
                            ("pbytes", num.pbytes[j]), ("fact", num.act[j][k] if fixed else 0.0),
                            ("fext", num.extra[j][k] if fixed else 0.0), ("blocks", u.kind == "block"),
                            ("pinned", fixed and al[0] != "none")):
                T[name].append(T[name][-1] + v)
            if not fixed:
                T["classes"].setdefault((u.rep, al), ([], j))[0].append(j)
        self._tab = self._shared["tab"] = T
        return T

    def _transient_any(self, a, b, no_full):
        """`transient(range(a, b), None, no_full)` without ZeRO-3 gathers, in O(1) per segment after an
        O(units) table: with after_j = P[b] - P[j+1] (P the prefix sums of each unit's least stash),
        max_j (rc_j - after_j) = max_j (rc_j + P[j+1]) - P[b].  The search asks it for every segment
        the exact partition tries, so the per-segment walk dominated the search time."""
        tabs = self._shared.setdefault("tr_tabs", {})
        tab = tabs.get(no_full)
        if tab is None:
            num, P, V = self.num, [0.0], []
            for j, u in enumerate(self.units):
                act = num.act[j]
                if u.kind != "block":
                    rc, least = num.live[j], act[0]
                else:
                    al = self.allowed(u)
                    if no_full and len(al) > 1:
                        al = tuple(p for p in al if p != "full")
                    rc = max((act[0] - act[POLICIES.index(p)] for p in al if p != "none"), default=0.0)
                    least = min(act[POLICIES.index(p)] for p in al)
                P.append(P[-1] + least)
                V.append(rc + P[-1])
            tab = tabs[no_full] = (P, V)
        P, V = tab
        if b <= a:
            return 0.0
        return max(0.0, max(V[a:b]) - P[b])

    def seg(self, i, a, b, detail=False):
        key = (i, a, b)
        if not detail and key in self.cache:
            return self.cache[key]
        num, cap = self.num, self.cap
        idx = self.device_units(i, a, b)
        b = b if isinstance(idx, list) else idx.stop      # dualpipev's rank p - 1: without the tail
        T = self._tab if self._tab is not None else self._tables()
        if self.cfg.pp > 1 and T["blocks"][b] == T["blocks"][a]:
            return self._unfit(key, detail)
        t = (T["t"][b] - T["t"][a]) + self.send_s(i, a, b) + num.prefetch_edges(a, b)
        e, n = (idx[b - a], self.n) if isinstance(idx, list) else (0, 0)     # dualpipev's rank 0: the tail
        t += (T["t"][n] - T["t"][e]) + num.prefetch_edges(e, n)
        # interleaved chunks of unequal size: the peak weighs each chunk's live forwards by its blocks,
        # and only the chunks through a backward by then hold accumulators (schedule.chunk_peak)
        ch = unequal_chunks(self.cfg, i, T["blocks"][b] - T["blocks"][a])
        infl = self.infl[i] if ch is None else chunk_peak(self.cfg.pp, self.cfg.m, self.cfg.v, i, ch)[0]
        acc = self.cfg.m > self.infl[i]     # a backward runs before the stage's activation peak (held_states)
        acc_at = None if ch is None else self.chunk_accumulators(i, a, b, ch)
        if acc_at is None:
            states = sum((T["states"][y] - T["states"][x]) - (0.0 if acc else T["gacc"][y] - T["gacc"][x])
                         for x, y in ((a, b), (e, n)))
        else:
            states = (T["states"][b] - T["states"][a]) - sum(num.gacc[j] for j in idx if not acc_at[j - a])
        if self.copies:     # weights other stages hold too, unpriced in this run's units (copies.py)
            states += sum(copy_bytes(self.copies, x, y, acc or acc_at is not None) for x, y in ((a, b), (e, n)) if y > x)
        z3 = (T["pbytes"][b] - T["pbytes"][a] + T["pbytes"][n] - T["pbytes"][e]) if self.cfg.zero == 2 else 0.0
        fixed_act, fixed_extra = T["fact"][b] - T["fact"][a], T["fext"][b] - T["fext"][a]
        tail = self.tail_act(i, a, b)       # the head + loss of an interleaved last stage: held once
        fixed_act -= tail
        # dualpipev's tail in the model's last stage holds stage_peak micro-batches (1 in torch's order)
        tail += (T["fact"][n] - T["fact"][e]) * (stage_peak(self.cfg.pp, self.cfg.m, 2 * self.cfg.pp - 1) if n else 0)
        types = self._free_types(T, a, b, detail)
        # plain ZeRO-3's per-unit gathers at their backward, with nothing recomputed
        still = self.transient(idx, {}) if self.cfg.zero == 3 else 0.0
        base = cap - states - z3 - tail
        # blocks pinned to selective/full recompute need the rematerialisation headroom regardless
        pinned = T["pinned"][b] > T["pinned"][a]
        choice = self._choose(a, b, types, base, fixed_act, fixed_extra, still, infl, pinned, idx)
        if choice is None:
            return self._unfit(key, detail)
        acts, extra, counts = choice
        T = t + extra
        if not detail:
            self.cache[key] = (T, True)
            return (T, True)
        return self._stage_result(i, a, b, types, counts, acts, extra, t, infl, acc, acc_at, tail, z3, idx)

    def _unfit(self, key, detail):
        """A run [a, b) that holds no block under pp, or whose memory fits no recomputation choice."""
        r = (math.inf, False) if not detail else None
        self.cache[key] = r
        return r

    def _free_types(self, T, a, b, detail) -> dict:
        """The free block types present in [a, b), in order of first appearance: type key -> [count,
        BlockOption, allowed policies, unit names (detail only), (positions, first index)]."""
        num = self.num
        types = {}
        for first, (tk, pos, j0) in sorted((pos[bisect_left(pos, a)], (tk, pos, j0))
                                           for tk, (pos, j0) in T["classes"].items()
                                           if bisect_left(pos, a) < len(pos) and pos[bisect_left(pos, a)] < b):
            lo = bisect_left(pos, a)
            names = [self.units[j].name for j in pos[lo:bisect_left(pos, b, lo)]] if detail else None
            types[tk] = [bisect_left(pos, b, lo) - lo, BlockOption(num.act[j0], num.extra[j0]), tk[1], names, (pos, lo)]
        return types

    def _choose(self, a, b, types, base, fixed_act, fixed_extra, still, infl, pinned, idx):
        """(activation bytes per micro-batch, recompute seconds, per-type policy counts) of the
        cheapest recomputation choice of the free blocks that fits `base` bytes, or None."""
        cap = self.cap
        free_act0 = sum(tv[0] * tv[1].act[0] for tv in types.values())
        if not pinned and fixed_act + free_act0 <= (base - still) / infl + 1e-9 * cap:
            return fixed_act + free_act0, fixed_extra, [(tv[0], 0, 0) for tv in types.values()]
        # one run of identical free blocks: the exact choice, priced with the transient of its best
        # order (recompute/ordered.py).  Otherwise the budget holds the largest transient any
        # choice could need (the plan reports the chosen one's), in two classes: choices without
        # full recomputation of a free block (their transient is the selective core's), and all
        # choices (full's).  Either class contains the uniform policy at its exact transient, so
        # no uniform choice that fits is lost.
        choice = None
        ordered = len(types) == 1 and isinstance(idx, range)        # (not dualpipev's rank 0: two runs)
        run, rc = self._ordered(a, b, types, base, fixed_act, infl) if ordered else (False, None)
        if rc is not None:
            choice = (fixed_act + rc.act_bytes, fixed_extra + rc.extra_s, list(rc.counts))
        tl = list(types.values())
        for no_full in (() if run else (True, False) if tl else (False,)):
            tlc = [[tv[0], tv[1], tuple(x for x in tv[2] if x != "full"), tv[3]] for tv in tl] if no_full else tl
            if no_full and all(tv[2] == t0[2] for tv, t0 in zip(tlc, tl)):
                continue            # no free block may use full: the second class is the same
            tr = self.transient(idx, None, no_full)
            budget = (base - tr) / infl - fixed_act
            if budget < 0:
                continue
            if len(tlc) == 1:      # one block type: the O(n) exact path, any allowed subset
                rc = choose_uniform(tlc[0][0], tlc[0][1], budget, tlc[0][2])
            elif not tlc:
                rc = None
                choice = (fixed_act, fixed_extra, [])
            else:
                rc = choose_recompute([(tv[0], tv[1]) for tv in tlc], budget) if all(
                    tv[2] == POLICIES for tv in tlc) else choose_restricted(tlc, budget)
            if rc is not None and (choice is None or fixed_extra + rc.extra_s < choice[1]):
                choice = (fixed_act + rc.act_bytes, fixed_extra + rc.extra_s, list(rc.counts))
        if not run and len(tl) > 1 and sum(tv[0] for tv in tl) <= MIXED_BLOCKS:
            # several block types: the bound above is loose; also try the cheapest Pareto count
            # choices with their blocks in the order the plan gets and their real transient
            # (stages of few blocks only: the frontier of long ones costs the search seconds)
            beat = choice[1] - fixed_extra if choice else math.inf
            rc = self._mixed(idx, tl, base - infl * fixed_act, infl, beat)
            if rc is not None:
                choice = (fixed_act + rc.act_bytes, fixed_extra + rc.extra_s, list(rc.counts))
        return choice

    def _stage_result(self, i, a, b, types, counts, acts, extra, t, infl, acc, acc_at, tail, z3, idx) -> StageResult:
        """The run [a, b) as stage i (its units `idx`), detailed: per-block policies, full recomputation
        on a type's first blocks, then selective (recompute/ordered.py: that order's transient is the least)."""
        num = self.num
        policies = _order_policies(list(types.values()), counts)
        for j in idx:
            u = self.units[j]
            al = self.allowed(u)
            if u.kind == "block" and len(al) == 1:
                policies[u.name] = al[0]
        transient = self.transient(idx, policies)
        st = {"params": 0.0, "grads": 0.0, "optimizer": 0.0}
        for j in idx:
            held = acc if acc_at is None else acc_at[j - a]
            for k2, v2 in held_states(self.units[j], self.cfg, held, self.ctx).items():
                st[k2] += v2
        for x, y in [(a, b)] if isinstance(idx, range) else [(a, b), (idx[b - a], self.n)]:
            for k2, v2 in copy_states(self.copies, x, y).items():
                st[k2] += v2
        fwd = sum(num.fwd[j] for j in idx) + (num.hf[a] if num.hf is not None else 0.0)
        return StageResult(
            index=i, units=[self.units[j].name for j in idx],
            blocks=[self.units[j].name for j in idx if self.units[j].kind == "block"],
            fwd_s=fwd, bwd_s=t - self.send_s(i, a, b) - fwd + extra, recompute_s=extra,
            send_s=self.send_s(i, a, b), send_bytes=self.send_bytes_of(i, a, b),
            grad_sync_s=sum(num.gs[j] for j in idx) + max((num.lat[j] for j in idx), default=0.0), in_flight=infl,
            memory={"params": st["params"], "grads": st["grads"], "optimizer": st["optimizer"],
                    "activations": acts * infl + tail, "transient": transient + z3},
            recompute=policies, param_tensors=sum(self.units[j].tensors for j in idx))

    def tail_act(self, i, a, b):
        """Stash bytes per micro-batch of the glue after the last block of an interleaved pipeline's
        last stage (head and loss), held for one micro-batch only: in the model's last virtual stage
        every forward is followed at once by its backward (torch's interleaved 1F1B).  Priced at the
        stage's average in flight, a 128k vocabulary's logits dominated the last stage.  0 elsewhere."""
        cfg = self.cfg
        if cfg.schedule != "interleaved" or cfg.v < 2 or i != cfg.pp - 1:
            return 0.0
        out = 0.0
        for j in range(b - 1, a - 1, -1):
            if self.units[j].kind == "block":
                break
            out += self.num.act[j][0]
        return out

    def _ordered(self, a, b, types, base, fixed_act, infl):
        """(True, recompute/ordered.py's exact choice or None) when [a, b) is glue, one contiguous run of
        free identical blocks and glue (the run's neighbours' stashes and terms, ZeRO-3 gathers, fed
        in); else (False, None)."""
        (k, opt, al, _, (pos, lo)), = types.values()
        blocks = self._tab["blocks"]
        first = pos[lo]
        last = first + k - 1
        if blocks[b] - blocks[a] != k or last >= b or blocks[last + 1] - blocks[first] != k:
            return False, None              # other blocks in the stage, or glue between these
        units, act = self.units, self.num.act
        # the glue's terms: what its backward holds beyond its stash (a loss's gradients, `live`) and
        # the ZeRO-3 gathers, less the glue's stash after it (the glue is fixed: "fact" holds it)
        live = self.num.live
        gath = zero3_gathered([units[j] for j in range(a, b)], [self.num.pbytes[j] for j in range(a, b)], self.cfg,
                              self.num.fsdp_held)
        gath = gath or [0.0] * (b - a)
        post_stash, post_term, pre_term, g_last, dg = 0.0, -math.inf, -math.inf, 0.0, 0.0
        g_front = None
        for j in range(b - 1, last, -1):
            post_term = max(post_term, gath[j - a] + live[j] - post_stash)
            post_stash += act[j][0]
        pre_stash = 0.0
        for j in range(first - 1, a - 1, -1):
            pre_term = max(pre_term, gath[j - a] + live[j] - pre_stash)
            pre_stash += act[j][0]
        if self.cfg.zero == 3:
            g_last = gath[last - a]
            # linear from the back up to the block behind the front one; the front block prefetches
            # nothing (numbers._prefetched), so its gathers are priced apart
            if k > 2:
                dg = (gath[first + 1 - a] - g_last) / (k - 2)
                g_front = gath[first - a]
            elif k == 2:
                dg = gath[first - a] - g_last
        return True, choose_ordered(k, opt, al, base, infl, fixed_act, post_stash, post_term, pre_term, g_last, dg,
                                    tol=1e-9 * self.cap, g_front=g_front)

    def _mixed(self, idx, tl, room, infl, beat, tries=64):
        """The first of the `tries` cheapest (stash, extra) Pareto count choices of several block types
        that fits `room` (bytes beside the fixed units' stashes) with its real transient, cheaper than
        `beat`; or None.  Not exact (the Pareto drop ignores the transient): bounded work."""
        from ...recompute.solver import RecomputeChoice, _pareto, _type_frontier
        cur = [(0.0, 0.0, ())]
        for n, opt, al, *_ in tl:
            f = _type_frontier(n, opt, al)
            cur = _pareto([(a1 + a2, e1 + e2, c1 + (c2,)) for a1, e1, c1 in cur for a2, e2, c2 in f])
        fixed = {self.units[j].name: self.allowed(self.units[j])[0] for j in idx
                 if self.units[j].kind == "block" and len(self.allowed(self.units[j])) == 1}
        tol = 1e-9 * self.cap
        for act, ext, counts in sorted(cur, key=lambda q: (q[1], q[0]))[:tries]:
            if ext >= beat - 1e-15:
                return None
            if infl * act > room + tol:
                continue
            pols = dict(fixed)
            named = [tv[:3] + [tv[3] or [self.units[j].name for j in tv[4][0][tv[4][1]:tv[4][1] + tv[0]]]] for tv in tl]
            pols.update(_order_policies(named, counts))
            if infl * act + self.transient(idx, pols) <= room + tol:
                return RecomputeChoice(act, ext, counts)
        return None


def _order_policies(tl, counts):
    """Per-block policies of a count choice: full recomputation on a type's first blocks, then
    selective (recompute/ordered.py: that order's transient is the least)."""
    policies = {}
    for tv, (nn, ns, nf) in zip(tl, counts):
        for q, name in enumerate(tv[3]):
            policies[name] = "full" if q < nf else ("selective" if q < nf + ns else "none")
    return policies


def choose_restricted(types, budget):
    """Recompute choice when some block types may only use a subset of the policies."""
    from ...recompute.solver import RecomputeChoice, _pareto, _type_frontier
    cur = [(0.0, 0.0, ())]
    for n, opt, al, *_ in types:
        f = _type_frontier(n, opt, al)
        cur = _pareto([(a1 + a2, e1 + e2, c1 + (c2,)) for a1, e1, c1 in cur for a2, e2, c2 in f])
    best = None
    for act, ext, counts in cur:
        if act <= budget * (1 + 1e-12) and (best is None or ext < best.extra_s):
            best = RecomputeChoice(act, ext, counts)
    return best
