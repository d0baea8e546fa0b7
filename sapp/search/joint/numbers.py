"""Per-unit numbers of one (profile, micro-batch size, ZeRO) and the stage-boundary send time."""
from __future__ import annotations

from ...costmodel import collective_time
from ...costmodel.gradsync import fsdp_prefetch_hidden, overlap_rule
from ...costmodel.torchtitan import fsdp_held_ratio
from ...pipeline.profile import cut_at_block_entry
from .cp import CPTerms
from ...recompute.modules import expert_kept
from .ep import moe_facts, overlap_key, unit_delta


class UnitNumbers:
    """Unit numbers at one (profile, micro-batch size, zero); identical units computed once."""

    def __init__(self, prof, cfg, ctx):
        per_rep = {}
        cpt = cp_terms(ctx, prof, cfg)
        rows = []
        for u in prof.units:
            key = u.rep if u.kind == "block" else u.name
            r = per_rep.get(key)
            if r is None:
                r = per_rep[key] = _values(u, cfg, cpt, ctx)
            rows.append(r)
        cols = [list(c) for c in zip(*rows)] if rows else [[] for _ in range(10)]
        self.t, self.act, self.extra, self.out, self.states, self.gs, self.pbytes, self.fwd, self.lat, self.gacc = cols
        # bytes beyond its stash each unit's backward holds (Unit.bwd_live: a loss's gradients under the
        # torchtitan profile), at the samples a cp rank runs
        bs = cfg.mbs / cfg.cp
        self.live = [u.bwd_live[0] + u.bwd_live[1] * bs for u in prof.units]
        # bytes per gathered byte a block's backward holds besides under ZeRO-3 (its unsharded gradients
        # and FSDP2's reduce-scatter input, costmodel.torchtitan.fsdp_held_ratio): zero3_gathered's `held`
        self.fsdp_held = fsdp_held_ratio(ctx.settings)
        # what a stage boundary after unit j sends per device: {j: (forward, of which not floating
        # point, backward)}, and the most over the cuts
        self.cuts = cut_bytes(prof, self.out, cfg)
        self.boundary, self.boundary_whole = max(((f, w) for f, w, _ in self.cuts.values()), default=(0.0, 0.0))
        self.boundary_grad = max((g for _, _, g in self.cuts.values()), default=0.0)
        # the boundary activation is a replica on every tp rank unless sequence parallelism sharded it
        self.replicated = boundary_replicated(prof)
        # ZeRO-3 under FSDP2's prefetch (costmodel.gradsync.fsdp_prefetch_hidden): the gather seconds each
        # unit hides behind its neighbour's compute; a stage gives back its first unit's forward share
        # and its last unit's backward share (`prefetch_edges`), whose neighbour is on another stage
        self.hf = self.hb = None
        if cfg.zero == 3 and overlap_rule(ctx.cluster, 3, cfg.pp, cfg.tp, ctx.settings.runtime) == "fsdp-units":
            gf, gb, cf, cb = _gathers(prof, cfg, self.fwd, self.t)
            self.hf, self.hb = fsdp_prefetch_hidden(gf, cf), fsdp_prefetch_hidden(gb[::-1], cb[::-1])[::-1]
            for j in range(len(self.t)):
                self.t[j] -= self.hf[j] + self.hb[j]
                self.fwd[j] -= self.hf[j]

    def prefetch_edges(self, a, b):
        """Gather seconds a stage of units [a, b) exposes beyond the per-unit sums: its first unit's
        forward gather and its last unit's backward gather have no neighbour on this stage to hide behind."""
        if self.hf is None or b <= a:
            return 0.0
        return self.hf[a] + self.hb[b - 1]


def cp_terms(ctx, prof, cfg):
    """CPTerms of a cp > 1 configuration (None at cp = 1), once per profile and (micro-batch size, cp,
    tp): the unit and bound numbers of every ZeRO stage and ep degree share them."""
    if cfg.cp <= 1:
        return None
    memo = prof.__dict__.setdefault("_cp_terms", {})
    key = (cfg.mbs, cfg.cp, cfg.tp)
    got = memo.get(key)
    if got is None:
        got = memo[key] = CPTerms(ctx, prof, cfg)
    return got


def _bound_values(u, cfg, cpt, ctx):
    """What BoundNumbers reads of `_values` (time, out, grad sync, fwd, sync latency), by the same
    operations, without the memory terms (the bounds are asked for every configuration)."""
    bs = cfg.mbs / cfg.cp
    f, b = u.fb_at(bs, cfg.zero)
    out = u.out_bytes[0] + u.out_bytes[1] * bs
    if cpt is not None:
        cf, cb, _, _ = cpt.of(u)
        f, b = f + cf, b + cb
    sync = u.grad_sync[cfg.zero] + replica_sync(u, cfg, ctx)
    if cfg.ep > 1:
        d = unit_delta(ctx, u, cfg)
        f, b = f + d["fwd_s"], b + d["bwd_s"]
        sync = max(0.0, sync + d["sync_s"])
    return (f + b, None, None, out, None, sync, None, f, u.sync_lat.get(cfg.zero, 0.0), None)


def replica_sync(u, cfg, ctx) -> float:
    """HSDP (cfg.rep > 1): seconds of the all-reduce of the unit's gradient shard across the rep replicas
    of its FSDP2 shard group, after the reduce-scatter within the group the profile prices (torchtitan's
    fully_shard on the (dp_replicate, dp_shard) mesh: the shard is 1/(dp x cp / rep) of the unit's
    gradient, reduced at FSDP2's reduce width).  The replicas are dp x cp x tp / rep ranks apart: on other
    nodes once a stage's ranks span nodes.  0 without HSDP."""
    if cfg.rep <= 1:
        return 0.0
    st = ctx.settings
    elems = u.states[0]["grads"] / st.grad_bytes
    link = "inter" if cfg.dp * cfg.cp * cfg.tp > ctx.cluster.gpus_per_node else "intra"
    return collective_time("all_reduce", elems * st.reduce_bytes / cfg.dp_cp, cfg.rep, link, ctx.cluster)


def _values(u, cfg, cpt, ctx):
    """(time, act, extra, out, states, grad sync, param bytes, fwd, sync latency, held accumulators)
    of one unit."""
    f, b, act, extra, out = u.at(cfg.mbs / cfg.cp, cfg.zero)   # a cp rank runs mbs/cp samples' tokens
    if cpt is not None:
        # K/V all-gather (forward, and again in a full recompute), reduce-scatter of their
        # gradients (backward), gathered K/V saved unless the block recomputes
        cf, cb, ca, cs = cpt.of(u)
        f, b = f + cf, b + cb
        act = (act[0] + ca, act[1] + cs, act[2])
        extra = (extra[0], extra[1], extra[2] + cf)
    sync = u.grad_sync[cfg.zero] + replica_sync(u, cfg, ctx)
    if cfg.ep > 1:
        d = unit_delta(ctx, u, cfg)      # expert parallelism: all-to-alls, load, expert-DP states
        f, b = f + d["fwd_s"], b + d["bwd_s"]
        da = d["act_per_sample"] * cfg.mbs / cfg.cp       # experts split over tp keep 1/tp of their ffn width
        if da:
            act = (act[0] + da, act[1] + da * expert_kept(ctx.settings.recompute_modules, moe_facts(ctx).get(u.name)),
                   act[2])
        # (never below zero: the profile's sync of this unit holds the experts' share)
        sync = max(0.0, sync + d["sync_s"])
    st = held_states(u, cfg, ctx=ctx)
    return (f + b, act, extra, out, st["params"] + st["grads"] + st["optimizer"],
            sync, u.states[0]["params"] - u.fsdp_exempt, f, u.sync_lat.get(cfg.zero, 0.0),
            st["grads"] - held_states(u, cfg, False, ctx)["grads"])


def _cuts(prof) -> list:
    """Indices j of the units a stage may end with: every block (as always priced), and glue a stage
    may end with (the next unit can start a stage; not before the first block under the block-entry
    cut of sequence parallelism, joint/evaluate._partition)."""
    got = prof.__dict__.get("_cuts")       # (once per profile: every configuration's numbers ask)
    if got is not None:
        return got
    units = prof.units
    first = next((i for i, u in enumerate(units) if u.kind == "block"), None)
    shut = first if (first is not None and cut_at_block_entry(prof)) else None
    got = prof._cuts = [j for j, u in enumerate(units) if u.kind == "block" or
                        (j + 1 < len(units) and units[j + 1].cut_before and j + 1 != shut)]
    return got


def cut_bytes(prof, out, cfg) -> dict:
    """{j: (forward bytes, of which not floating point, backward bytes)} one device sends per
    micro-batch at a stage boundary right after unit j, for every unit a stage may end with: the
    unit's output (and its gradient) when it crosses, plus the side tensors (sapp/pipeline/boundary.py:
    position-only ones are recomputed by every stage; the others go forward, and their gradient
    back only when they carry one)."""
    b = cfg.mbs / cfg.cp
    memo = prof.__dict__.setdefault("_side_at", {})     # (per profile and micro-batch: the same for every zero)
    side = memo.get(b)
    if side is None:
        side = memo[b] = [(j, tuple(c0 + c1 * b for c0, c1 in getattr(prof.units[j], "side", _NO_SIDE)),
                           getattr(prof.units[j], "out_crosses", True)) for j in _cuts(prof)]
    out_d = {}
    for j, (fl, other, bwd), crosses in side:
        own = out[j] if crosses else 0.0
        out_d[j] = (own + fl + other, other, own + bwd)
    return out_d


_NO_SIDE = ((0.0, 0.0),) * 3


class BoundNumbers:
    """What the profile bound needs (sum and max of unit times, gradient sync, largest latency,
    boundary bytes), from each distinct unit once times its count: O(distinct units), not O(units),
    because the bound is computed for every configuration."""

    def __init__(self, prof, cfg, ctx):
        counts = getattr(prof, "_rep_counts", None)
        if counts is None:
            counts = {}
            for u in prof.units:
                key = u.rep if u.kind == "block" else u.name
                if key not in counts:
                    counts[key] = [u, 0]
                counts[key][1] += 1
            prof._rep_counts = counts
        cpt = cp_terms(ctx, prof, cfg)
        self.tot = self.tmax = self.gs = self.lat = self.boundary = 0.0
        self.tblock = None          # the cheapest block's time (whole blocks per stage)
        self.gs_block = 0.0         # the cheapest block's gradient sync (the least last bucket)
        # ZeRO-3 under FSDP2's prefetch hides a gather by at most its neighbour's compute
        # (costmodel.gradsync.fsdp_prefetch_hidden), so by at most the largest unit's (a lower bound)
        prefetch = cfg.zero == 3 and overlap_rule(ctx.cluster, 3, cfg.pp, cfg.tp, ctx.settings.runtime) == "fsdp-units"
        vals = [(u, k, _bound_values(u, cfg, cpt, ctx)) for u, k in counts.values()]
        if prefetch:
            gath = {id(u): _unit_gather(u, cfg) for u, _, _ in vals}
            cf = max(max(0.0, v[7] - gath[id(u)][0]) for u, _, v in vals)
            cb = max(max(0.0, v[0] - v[7] - gath[id(u)][1]) for u, _, v in vals)
        blocks_gs = []
        for u, k, (t, _, _, out, _, gs, _, _, lat, _) in vals:
            if prefetch:
                gf, gb = gath[id(u)]
                t -= min(gf, cf) + min(gb, cb)
            self.tot += k * t
            self.tmax = max(self.tmax, t)
            if u.kind == "block":
                self.tblock = t if self.tblock is None else min(self.tblock, t)
                blocks_gs.append(gs)
            self.gs += k * gs
            self.lat = max(self.lat, lat)
            if u.kind == "block":
                self.boundary = max(self.boundary, out)
        self.gs_block = min(blocks_gs, default=0.0)


def _unit_gather(u, cfg):
    """(forward, backward) seconds of a unit's ZeRO-3 parameter gathers at this micro-batch size: what
    the profile's ZeRO-3 curves add to its ZeRO-0 ones (batch-independent: pipeline/profile.py), less
    the FSDP2 copies a torchtitan profile runs on the compute stream (Unit.zcopy: not hideable)."""
    b = cfg.mbs / cfg.cp
    f3, b3 = u.fb_at(b, 3)
    f0, b0 = u.fb_at(b, 0)
    c3, c0 = u.zcopy.get(3, (0.0, 0.0)), u.zcopy.get(0, (0.0, 0.0))     # FSDP2's copies on the compute stream
    return max(0.0, f3 - f0 - (c3[0] - c0[0])), max(0.0, b3 - b0 - (c3[1] - c0[1]))


def _gathers(prof, cfg, fwd, t):
    """Per unit in forward order: (forward gathers, backward gathers, forward compute, backward compute),
    compute being the unit's priced time less its gathers."""
    gf, gb, cf, cb = [], [], [], []
    memo = {}           # identical blocks share their representative's curves: one evaluation per type
    for u, f, tt in zip(prof.units, fwd, t):
        key = u.rep if u.kind == "block" else u.name
        if key not in memo:
            memo[key] = _unit_gather(u, cfg)
        g1, g2 = memo[key]
        gf.append(g1)
        gb.append(g2)
        cf.append(max(0.0, f - g1))
        cb.append(max(0.0, tt - f - g2))
    return gf, gb, cf, cb


def boundary_replicated(prof) -> bool:
    """Whether a stage boundary's activation is the same on every tp rank (tp > 1 without sequence
    parallelism placed): then each tp rank can send 1/tp of it and the next stage all-gather it."""
    if prof.tp <= 1:
        return False
    method = getattr(prof, "method", "") or ""
    return not (getattr(prof, "sp", False) and "+sp" in method and "+sp-unavailable" not in method)


def bound_numbers(ctx, prof, cfg):
    key = ("bound", prof.dp, prof.tp, getattr(prof, "sp", False), cfg.mbs, cfg.zero, cfg.cp, cfg.ep, cfg.rep) + \
        overlap_key(ctx, cfg)
    n = ctx.numbers.get(key)
    if n is None:
        n = ctx.numbers[key] = BoundNumbers(prof, cfg, ctx)
    return n


def held_states(unit, cfg, accumulators=True, ctx=None):
    """Model-state bytes ({"params", "grads", "optimizer"}) a device holds for `unit` under what the
    emitter runs, not only the ZeRO formula.  ZeRO-2 is FSDP2 with reshard_after_forward=False: its
    parameters are the P/dp shards (the gathered copy it holds from forward to backward is priced by
    `gathered_params`, as the meter sees it).  FSDP2 (ZeRO-2/3) accumulating over several micro-batches
    keeps the unsharded gradients between them (the emitted accumulation loop turns
    set_requires_gradient_sync off until the last one; torch.distributed.pipelining's stages do the
    same): the whole G is alive next to the activations, where the G/dp shards are not (the step's
    zero_grad(set_to_none) dropped them; the last backward's reduce-scatter writes them unit by unit,
    freeing each unit's accumulators).  `accumulators` False: a stage whose activation peak comes
    before its first backward (m <= micro-batches in flight) holds no gradient then, and after it
    at least one micro-batch less of activations: priced with the shards."""
    st = dict(unit.states[cfg.zero])
    if cfg.zero == 2:
        st["params"] = unit.states[3]["params"]
    if cfg.zero >= 2 and cfg.m > 1 and accumulators:
        st["grads"] = unit.states[0]["grads"]
    if ctx is not None and cfg.ep > 1:
        for k, v in unit_delta(ctx, unit, cfg)["states"].items():
            st[k] += v
    return st


def gathered_params(units, pbytes, cfg):
    """Bytes of FSDP2's gathered (unsharded) parameters alive at and after a stage's activation peak,
    beyond what `zero3_gathered` prices per unit: ZeRO-2 (reshard_after_forward=False), every unit's,
    held from its forward to its backward.  ZeRO-3: none here (the emitter shards the root with
    reshard_after_forward=True too: nothing stays gathered after a forward)."""
    return sum(pbytes) if cfg.zero == 2 else 0.0


def zero3_gathered(units, pbytes, cfg, held=0.0):
    """ZeRO-3: per unit, the bytes gathered while its backward runs: the root unit (the stage's
    non-block units, gathered by the root's pre-backward and resharded by its post-backward, the
    last to run) plus the block itself, plus the unit FSDP2's backward prefetch gathers meanwhile
    (`_prefetched`: one extra unit in flight); in a pipeline stage running several micro-batches, every
    block from this one to the stage's end (torch.distributed.pipelining turns reshard-after-backward
    off until the step's last backward, so a unit stays gathered from its backward until the next
    forward reshards it).  `held`: bytes per gathered byte a block's backward holds besides, FSDP2's
    unsharded gradients and reduce-scatter input under a torchtitan profile
    (costmodel.torchtitan.fsdp_held_ratio).  None without ZeRO-3."""
    if cfg.zero != 3:
        return None
    root = sum(b for u, b in zip(units, pbytes) if u.kind != "block")
    blocks = [b if u.kind == "block" else 0.0 for u, b in zip(units, pbytes)]
    pre = _prefetched(units, blocks)
    if cfg.pp > 1 and cfg.m > 1:
        kept, out = 0.0, []
        for b, p in zip(reversed(blocks), reversed(pre)):
            kept += b
            out.append(root + kept + held * b + p)
        return out[::-1]
    return [root + b * (1.0 + held) + p for b, p in zip(blocks, pre)]


def _prefetched(units, blocks):
    """Per unit: the bytes FSDP2's backward prefetch holds gathered while that unit's backward runs
    (torch 2.13 FSDPParamGroup._backward_prefetch: a unit's pre-backward all-gathers the unit before it
    in forward order, into a buffer alive until that unit's own backward starts; CPU/gloo too, the
    gather is then synchronous).  A block: the previous block of the stage (none for the first: the
    root, before it, is gathered already); a root (glue) unit after the blocks: the last block (the
    root's pre-backward, the first of the backward, prefetches it)."""
    out, prev = [], 0.0
    for u, b in zip(units, blocks):
        out.append(prev if u.kind == "block" else 0.0)
        if u.kind == "block":
            prev = b
    last = max((j for j, u in enumerate(units) if u.kind == "block"), default=None)
    if last is not None:
        for j in range(last + 1, len(units)):
            out[j] = prev
    return out


def unit_numbers(ctx, prof, cfg):
    key = (prof.dp, prof.tp, cfg.mbs, cfg.zero, cfg.m > 1, cfg.pp > 1, cfg.cp, cfg.ep, getattr(prof, "sp", False), cfg.rep) + \
        overlap_key(ctx, cfg)
    n = ctx.numbers.get(key)
    if n is None:
        n = ctx.numbers[key] = UnitNumbers(prof, cfg, ctx)
    return n


def p2p_time(ctx, cfg, nbytes, replicated=True):
    """Seconds of one stage-boundary send of `nbytes` per device (forward activation or backward
    gradient), the cheaper of the plain send and Megatron's scatter/gather (`boundary_send`).
    `replicated` False: the tensor is already a per-tp-rank shard (sequence parallelism).  The default
    (True) is what the bounds need: never more than the priced send."""
    return boundary_send(ctx, cfg, nbytes, replicated)[0]


def boundary_send(ctx, cfg, nbytes, replicated=True):
    """(seconds, scatter/gather used, bytes each device sends) of one stage-boundary send.  Plain:
    every tp rank sends its whole replica over the inter-stage link.  Scatter/gather (Megatron's
    scatter_gather_tensors_in_pipeline, emitted by sapp/emit/pp/pipe.ScatterGather): each tp rank
    sends 1/tp of it and the receiving stage all-gathers the pieces over the tp group's link (the
    same in backward for the gradient).  A decided choice, not a searched one: it is taken exactly
    when it prices cheaper (stages on other nodes than their neighbours, where the tp group's NVLink
    is far faster than the network); between stages inside one node both cross the same link and
    the gather's extra latency makes the plain send the cheaper."""
    if cfg.pp == 1 or nbytes <= 0:
        return 0.0, False, 0.0
    cl = ctx.cluster
    gpn = cl.gpus_per_node
    S = cl.devices // cfg.pp
    link = "inter" if (S >= gpn or S * cfg.pp > gpn) else "intra"
    plain = collective_time("p2p", nbytes, 2, link, cl)
    t = cfg.tp
    if t <= 1 or not replicated:
        return plain, False, nbytes
    tp_link = "intra" if t <= gpn else "inter"
    sg = collective_time("p2p", nbytes / t, 2, link, cl) + collective_time("all_gather", nbytes, t, tp_link, cl)
    return (sg, True, nbytes / t) if sg < plain else (plain, False, nbytes)


class Sends:
    """A configuration's stage-boundary sends, per device and micro-batch (`boundary_sends`): `sg`,
    Megatron's scatter/gather, decided once for every boundary and both directions (the emitter hooks
    them all); `f[j]` / `b[j]`: (seconds, bytes) of the forward send after a stage ending with unit j
    and of the backward send into it; `fmax`/`bmax` (the most over the cuts: the plan's record and
    interleaved chunks) and `fmin`/`bmin` (the bounds')."""

    def __init__(self, sg, f, b):
        self.sg, self.f, self.b = sg, f, b
        zero = (0.0, 0.0)
        self.fmax, self.bmax = max(f.values(), default=zero), max(b.values(), default=zero)
        self.fmin, self.bmin = min(f.values(), default=zero), min(b.values(), default=zero)


def boundary_sends(ctx, cfg, num) -> Sends:
    """The sends of every cut of `num` (UnitNumbers.cuts).  The forward carries the activation and
    the side tensors (sapp/pipeline/boundary.py), the backward only the gradients that exist, so the
    two differ when a side tensor has none (a mask built from an input).  Scatter/gather is taken when
    it prices the largest cut's pair of sends cheaper (`boundary_send`); under it each floating-point
    tensor is cut to 1/tp and all-gathered after the send, a tensor of another dtype goes whole."""
    if cfg.pp == 1 or not num.cuts:
        return Sends(False, {}, {})
    cl, t = ctx.cluster, cfg.tp
    S = cl.devices // cfg.pp
    link = "inter" if (S >= cl.gpus_per_node or S * cfg.pp > cl.gpus_per_node) else "intra"
    tp_link = "intra" if t <= cl.gpus_per_node else "inter"

    def p2p(n):
        return collective_time("p2p", n, 2, link, cl) if n > 0 else 0.0

    def gather(n):
        return collective_time("all_gather", n, t, tp_link, cl) if n > 0 else 0.0

    def plain(f, whole, g):
        return (p2p(f), f), (p2p(g), g)

    def split(f, whole, g):
        cut = f - whole
        return (p2p(cut / t + whole) + gather(cut), cut / t + whole), (p2p(g / t) + gather(g), g / t)
    sg = False
    if t > 1 and num.replicated:
        big = (num.boundary, num.boundary_whole, num.boundary_grad)
        (a, _), (b, _) = split(*big)
        (c, _), (d, _) = plain(*big)
        sg = a + b < c + d
    rule = split if sg else plain
    sends = {j: rule(*v) for j, v in num.cuts.items()}
    return Sends(sg, {j: v[0] for j, v in sends.items()}, {j: v[1] for j, v in sends.items()})
