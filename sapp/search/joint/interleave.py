"""Interleaved pipelines' block counts: the layouts a configuration's chunks are priced in and the
least blocks per stage (read by the evaluation, the configurations and the bounds); and the chunked
schedules over blocks of several types, each device priced over the units it really holds."""
from __future__ import annotations

import math

from ...pipeline.dualpipe import stage_peak
from ...pipeline.partition import (chunk_counts, dualpipev_layout, interleaved_layout, partition_counts, stage_end,
                                   stage_kmins)
from .copies import copy_bytes, copy_states
from .numbers import held_states
from .result import StageResult
from .stage import _order_policies, chunk_peak, unequal_chunks


def glue_ends(ctx):
    """(prologue, epilogue): whether glue (embedding; head and loss) precedes / follows the blocks."""
    return ctx.units[0].kind != "block", ctx.units[-1].kind != "block"


def interleave_steps(ctx, cfg):
    """Blocks per unit of the interleaved count partition, one per layout to price: v (stages hold
    whole rows of v blocks: equal chunks, the closed-form schedule) or 1 (any count >= the stage's
    minimum, chunks as equal as they go, the schedule simulator).  The free search deals its v
    (divisors of the L blocks, at most L / pp) in rows.  A pinned v whose rows do not spread evenly
    over the pp stages (pp * v does not divide L) is also priced as equal as the blocks go, and the
    faster kept: rows there leave some stages a whole row more (Llama-3-405B, 126 blocks, pp 16,
    pinned v 7: 14 stages of 7 blocks and 2 of 14, 21.1 s against 13.4 s at 7 / 8 blocks a stage)."""
    if cfg.schedule != "interleaved" or cfg.v <= 1 or ctx.L % cfg.v or ctx.L < cfg.pp * cfg.v or not ctx.uniform:
        return (1,)
    if ctx.cons.virtual_chunks is not None and ctx.L % (cfg.pp * cfg.v):
        return (cfg.v, 1)
    return (cfg.v,)


def interleave_step(ctx, cfg):
    """The finest of interleave_steps, which the bounds assume (bounds.profile_bound, memory_bound):
    single blocks reach every count rows of v reach, so their bound holds for both layouts."""
    return min(interleave_steps(ctx, cfg))


def interleave_kmins(ctx, cfg):
    """Least blocks per stage under interleaving (partition.stage_kmins): v, or on the first / last
    stage v - 1 with a glue-only chunk where the pinned v asks for more chunks than the blocks give."""
    return stage_kmins(ctx.L, cfg.pp, cfg.v, *glue_ends(ctx)) or cfg.v


# Blocks of several types (DeepSeek-V3's 3 dense layers before 58 MoE ones): a device's chunks are
# priced over the blocks the real layout deals it, not as a contiguous run renamed afterwards (which
# is exact only for identical blocks).

def mixed_chunked(ctx, cfg) -> bool:
    """Whether cfg's chunks are priced over the units each device really holds (mixed_stages)."""
    return cfg.pp > 1 and cfg.v > 1 and cfg.schedule in ("interleaved", "dualpipev") and not ctx.uniform


def device_runs(units, layout, p, tail=None):
    """Per device, the runs [(a, b)] of units its chunks hold, in chunk order (`layout`: partition.
    interleaved_layout / dualpipev_layout, every chunk a block at least; glue only before and after
    the blocks): the embedding with the model's first chunk, the head and loss with its last, or,
    `tail` (StageEvaluator.v_tail), as a run of its own on rank 0.  A device's adjacent chunks
    (DualPipeV's rank p - 1: stages p - 1 and p) form one run, as the contiguous path prices them."""
    blk = [j for j, u in enumerate(units) if u.kind == "block"]
    runs, pos = [[] for _ in range(p)], 0
    for q, (d, _, k) in enumerate(layout):
        a = 0 if q == 0 else blk[pos]
        b = blk[pos + k] if q < len(layout) - 1 else (len(units) if tail is None else tail)
        if runs[d] and runs[d][-1][1] == a:
            runs[d][-1] = (runs[d][-1][0], b)
        else:
            runs[d].append((a, b))
        pos += k
    return runs


def seg_runs(ev, i, runs, tail=None, detail=False):
    """StageEvaluator.seg for device i holding the units of `runs` (device_runs) and, DualPipeV's rank
    0, the head and loss `tail` (a run (e, n)): the same terms summed over the runs, the tail held for
    stage_peak micro-batches, the chunks' activations weighed as the contiguous path weighs them."""
    if tail is None and len(runs) == 1:
        return ev.seg(i, *runs[0], detail=detail)
    key = ("runs", i, tuple(runs), tail)
    if not detail and key in ev.cache:
        return ev.cache[key]
    cfg, num = ev.cfg, ev.num
    T = ev._tab if ev._tab is not None else ev._tables()
    every = list(runs) + ([tail] if tail else [])
    idx = [j for x, y in every for j in range(x, y)]

    def tot(name, rs=every):
        return sum(T[name][y] - T[name][x] for x, y in rs)
    k = tot("blocks", runs)
    if k == 0:
        return ev._unfit(key, detail)
    t = tot("t") + ev.send_s(i) + sum(num.prefetch_edges(x, y) for x, y in every)
    ch = unequal_chunks(cfg, i, k)
    infl = ev.infl[i] if ch is None else chunk_peak(cfg.pp, cfg.m, cfg.v, i, ch)[0]
    acc = cfg.m > ev.infl[i]
    acc_at = None if ch is None else _accumulators(ev, i, idx, ch)
    if acc_at is None:
        states = tot("states") - (0.0 if acc else tot("gacc"))
    else:
        states = tot("states") - sum(num.gacc[j] for j in idx if not acc_at[j])
    if ev.copies:
        states += sum(copy_bytes(ev.copies, x, y, acc or acc_at is not None) for x, y in every if y > x)
    z3 = tot("pbytes") if cfg.zero == 2 else 0.0
    fixed_act, fixed_extra = tot("fact", runs), tot("fext", runs)
    held_once = ev.tail_act(i, *runs[-1])      # an interleaved last chunk's head and loss: held once
    fixed_act -= held_once
    if tail:
        held_once += tot("fact", [tail]) * stage_peak(cfg.pp, cfg.m, 2 * cfg.pp - 1)
    types = {}
    for x, y in runs:
        for tk, tv in ev._free_types(T, x, y, True).items():
            if tk in types:
                types[tk][0] += tv[0]
                types[tk][3] = types[tk][3] + tv[3]
            else:
                types[tk] = tv
    still = ev.transient(idx, {}) if cfg.zero == 3 else 0.0
    base = ev.cap - states - z3 - held_once
    choice = ev._choose(None, None, types, base, fixed_act, fixed_extra, still, infl, tot("pinned", runs) > 0, idx)
    if choice is None:
        return ev._unfit(key, detail)
    acts, extra, counts = choice
    if not detail:
        ev.cache[key] = (t + extra, True)
        return ev.cache[key]
    return _runs_result(ev, i, every, idx, types, counts, acts, extra, t, infl, acc, acc_at, held_once, z3)


def _accumulators(ev, i, idx, ch):
    """StageEvaluator.chunk_accumulators over the units `idx` (chunk order): unit -> whether its chunk
    already ran a backward at the device's activation peak."""
    seen = chunk_peak(ev.cfg.pp, ev.cfg.m, ev.cfg.v, i, ch)[1]
    owner = [c for c, n in enumerate(ch) for _ in range(n)]
    out, r = {}, 0
    for j in idx:
        if ev.units[j].kind == "block":
            out[j] = seen[owner[r]]
            r += 1
        else:
            out[j] = seen[0] if r == 0 else seen[-1]
    return out


def _runs_result(ev, i, every, idx, types, counts, acts, extra, t, infl, acc, acc_at, tail, z3):
    """StageEvaluator._stage_result over the runs `every` (units `idx`)."""
    num, units = ev.num, ev.units
    policies = _order_policies(list(types.values()), counts)
    for j in idx:
        al = ev.allowed(units[j])
        if units[j].kind == "block" and len(al) == 1:
            policies[units[j].name] = al[0]
    transient = ev.transient(idx, policies)
    st = {"params": 0.0, "grads": 0.0, "optimizer": 0.0}
    for j in idx:
        for k2, v2 in held_states(units[j], ev.cfg, acc if acc_at is None else acc_at[j], ev.ctx).items():
            st[k2] += v2
    for x, y in every:
        for k2, v2 in copy_states(ev.copies, x, y).items():
            st[k2] += v2
    fwd = sum(num.fwd[j] for j in idx) + (num.hf[idx[0]] if num.hf is not None else 0.0)
    send = ev.send_s(i)
    return StageResult(
        index=i, units=[units[j].name for j in idx], blocks=[units[j].name for j in idx if units[j].kind == "block"],
        fwd_s=fwd, bwd_s=t - send - fwd + extra, recompute_s=extra, send_s=send,
        send_bytes=ev.send_bytes_of(i, None, None),
        grad_sync_s=sum(num.gs[j] for j in idx) + max((num.lat[j] for j in idx), default=0.0), in_flight=infl,
        memory={"params": st["params"], "grads": st["grads"], "optimizer": st["optimizer"],
                "activations": acts * infl + tail, "transient": transient + z3},
        recompute=policies, param_tensors=sum(units[j].tensors for j in idx))


def mixed_stages(ctx, ev, cfg):
    """(stages, each device's units, chunk shares, the tied-weight ranges, each stage's (a, b) for
    its sends) of a chunked schedule over blocks of several types, or None: per-device block counts
    (pinned, or _mixed_counts), dealt into the real layout, each device priced over its own units."""
    p, v, tail = cfg.pp, cfg.v, ev.v_tail
    tail_run = (tail, ev.n) if tail is not None else None
    layout = dualpipev_layout if cfg.schedule == "dualpipev" else interleaved_layout

    def price(counts, detail=False):
        runs = device_runs(ev.units, layout(counts, v), p, tail)
        return runs, [seg_runs(ev, i, runs[i], tail_run if i == 0 else None, detail) for i in range(p)]
    if ctx.stage_pins is not None:
        counts = [sum(1 for s in ctx.stage_pins if s == i) for i in range(p)]
        counts = counts if min(counts) >= v else None
    else:
        counts = _mixed_counts(ctx, ev, cfg, price)
    if counts is None:
        return None
    runs, stages = price(counts, detail=True)
    if any(s is None for s in stages):
        return None
    held = [[j for x, y in rs for j in range(x, y)] + (list(range(*tail_run)) if tail_run and i == 0 else [])
            for i, rs in enumerate(runs)]
    for st, k in zip(stages, counts):
        st.chunks = chunk_counts(k, v, stage_end(st.index, p))
        st.chunk_shares = _unit_shares(ev, held[st.index], st.chunks)
    shares = [st.chunk_shares for st in stages]
    # the tied-weight sync reads stage q as pipeline rank q % p: run c of device d in slot c * p + d
    every = [rs + ([tail_run] if tail_run and i == 0 else []) for i, rs in enumerate(runs)]
    ranges = [every[d][c] if c < len(every[d]) else (0, 0) for c in range(max(map(len, every))) for d in range(p)]
    return stages, held, shares, ranges, [(None, None)] * p


def _mixed_counts(ctx, ev, cfg, price):
    """Blocks per device: the count partition (partition_counts) on a first guess, device i as a
    contiguous run of k blocks (the first device from the model's start, the others of the kind the
    last blocks are), then one block at a time from the slowest device to another while the real
    layout's bottleneck drops."""
    p, n, units, v = cfg.pp, ev.n, ev.units, cfg.v
    pre = next(j for j, u in enumerate(units) if u.kind == "block")
    post = n - pre - ctx.L

    def seg_k(i, k):
        return ev.seg(0, 0, pre + k) if i == 0 else ev.seg(i, n - post - k, n if i == p - 1 else n - post)
    counts, _ = partition_counts(ctx.L, p, seg_k, kmin=v)
    if counts is None:
        base, extra = divmod(ctx.L, p)
        if base < v:
            return None
        counts = [base + (i < extra) for i in range(p)]

    def times(c):
        return [s[0] for s in price(c)[1]]
    cur = times(counts)
    for _ in range(ctx.L):
        slow = max(range(p), key=cur.__getitem__)
        if counts[slow] <= v:
            break
        for dst in sorted((d for d in range(p) if d != slow), key=cur.__getitem__):
            c2 = list(counts)
            c2[slow] -= 1
            c2[dst] += 1
            t2 = times(c2)
            if max(t2) < max(cur):
                counts, cur = c2, t2
                break
        else:
            break
    return counts if max(cur) < math.inf else None


def _unit_shares(ev, idx, chunks):
    """Fractions of a device's time its chunks take, from the units each holds (the glue before its
    first block in chunk 0, after its last in the last chunk)."""
    owner = [c for c, k in enumerate(chunks) for _ in range(k)]
    t, r = [0.0] * len(chunks), 0
    for j in idx:
        if ev.units[j].kind == "block":
            c, r = owner[r], r + 1
        else:
            c = 0 if r == 0 else len(chunks) - 1
        t[c] += ev.num.t[j]
    total = sum(t)
    return [x / total for x in t] if total > 0 else [1.0 / len(chunks)] * len(chunks)
