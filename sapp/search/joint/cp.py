"""Context parallelism inside the joint search: which cp degrees a model admits, and the per-block
terms a cp > 1 configuration adds to the stage profile (sapp/costmodel/context.py prices them).

How a CP configuration is priced.  cp ranks share each sample's sequence, every op of the layer runs
on 1/cp of the tokens and (load-balanced causal chunks) every rank does 1/cp of the attention pairs,
and parameters are replicated over cp with gradients averaged over dp x cp.  That is the stage profile
of a dp·cp-way data-parallel stage evaluated at micro-batch mbs/cp samples per rank: the same token
count, the same gradient-sync group (dp·cp ranks, ZeRO sharding over them), the same link.  So a CP
configuration shares the profile of (dp·cp, tp) with the plain data-parallel configurations (no new
sharding search), and adds per block the K/V all-gather (forward, again when a fully recomputed
block reruns its forward), the gradients' reduce-scatter (backward) and the gathered K/V it saves."""
from __future__ import annotations

from ...costmodel.context import check_sequence, cp_link, kv_exchange_time, kv_saved_bytes
from ...costmodel.dtypes import fused_alias, operand_bytes, out_bytes
from ...pipeline.profile import attention_core

# walked through when looking for the un-expanded K/V a grouped-query attention repeats per head
_PASS_KINDS = ("view", "elementwise")


def sequence_length(graph):
    """The model's sequence length: the zoo's / HF config's `seq`, else the token ids' second axis."""
    meta = graph.meta or {}
    for k in ("seq", "s"):
        v = meta.get(k)
        if isinstance(v, int) and v > 0:
            return v
    cfg = meta.get("config") or {}
    if isinstance(cfg.get("s"), int):
        return cfg["s"]
    for node in graph.nodes.values():
        if node.kind == "embedding" and node.operands:
            ids = [o for o in node.operands if o.param is None]
            if ids and len(ids[0].dims) >= 2:
                d = {x.name: x.size for x in node.dims}
                return d.get(ids[0].dims[1])
    return None


def _kv_operands(graph, names):
    """[(node, operand index)] of a block's K and V inputs to attention, [] if it has none."""
    attn = [n for n in names if graph.nodes[n].kind == "attention"]
    if attn:                                                   # a fused SDPA node: (q, k, v)
        return [(attn[0], 1), (attn[0], 2)]
    core = attention_core(graph, names)
    if not core:
        return []
    bmm = [n for n in names if graph.nodes[n].kind in ("matmul", "attention")
           and not graph.nodes[n].params and len(graph.nodes[n].producers) >= 2]
    return [(bmm[0], 1), (bmm[1], 1)]                          # q·kᵀ's kᵀ, p·v's v


def _unexpanded_numel(graph, node_name, i):
    """Elements of operand i before any repeat/expand (grouped-query K/V are gathered un-repeated)."""
    o = graph.nodes[node_name].operands[i]
    best, prod = o.numel, o.producer
    for _ in range(8):
        if prod is None or prod not in graph.nodes:
            break
        p = graph.nodes[prod]
        # views, expands and single-input copies (a reshape of an expanded tensor is a clone);
        # never a two-input op (rotary's k·cos: cos would look like a smaller K)
        if p.kind not in _PASS_KINDS or len([x for x in p.operands if x.param is None]) != 1:
            break
        src = p.operands[0]
        if src.param is not None:
            break
        best = min(best, src.numel)
        prod = src.producer
    return best


def _per_sample(graph, node, numel, kept, strategies, tp_index, tp, dims):
    """Bytes per whole sample on one tensor-parallel rank of a tensor with `numel` elements."""
    b = numel * kept / graph.batch_size
    s = strategies.get(node.name)
    if tp > 1 and s is not None and tp_index is not None and s[tp_index] in dims:
        b /= tp                                                # heads split over tp
    return b


def kv_bytes_per_sample(graph, names, strategies, tp_index, tp, settings):
    """Bytes of a block's K and V for one whole sample on one tensor-parallel rank (0: no attention):
    what the cp ranks exchange (un-repeated under grouped-query attention).
    `strategies` may be the template's (a block's representative carries the block's splits)."""
    return kv_saved_per_sample(graph, names, strategies, tp_index, tp, settings)[0]


def kv_saved_per_sample(graph, names, strategies, tp_index, tp, settings):
    """(exchanged, saved one-device, saved under cp, fused output) bytes per whole sample on one
    tensor-parallel rank, as sapp/emit/cp/cp.py runs the block's attention:
    - exchanged: K and V un-repeated (what is all-gathered);
    - saved one-device: K and V as the attention operands the profile prices (repeated where the
      model repeats the key/value heads before the kernel, except under "fused");
    - saved under cp: the gathered K and V the cp attention keeps -- un-repeated for a fused kernel
      (it shares the heads, enable_gqa), in operand form for eager ops (the model's repeat runs on
      the gathered keys);
    - fused output: a fused kernel runs once per local chunk, and the chunks' outputs (saved by the
      kernel) are concatenated into one more tensor the output projection keeps; eager attention has
      no such copy (0)."""
    ex = base = cp_saved = out = 0.0
    for node_name, i in _kv_operands(graph, names):
        node = graph.nodes[node_name]
        _, kept = operand_bytes(node, i, settings)
        dims = node.operands[i].dims
        unexpanded = _unexpanded_numel(graph, node_name, i)
        u = _per_sample(graph, node, unexpanded, kept, strategies, tp_index, tp, dims)
        # what the profile priced for this operand: under "fused" flash keeps grouped k, v un-repeated
        # (costmodel.fusion); v's whole-projection alias stays (the local projection buffer is still
        # held), so only v's own share is this rank's K/V here
        priced = node.operands[i].numel
        if settings.fused and fused_alias(node, i) is not None:
            priced = unexpanded
        whole = _per_sample(graph, node, priced, kept, strategies, tp_index, tp, dims)
        ex += u
        base += whole
        cp_saved += u if node.kind == "attention" else whole
        if node.kind == "attention" and i == 1:
            out = _per_sample(graph, node, node.out.numel, out_bytes(node, settings),
                              strategies, tp_index, tp, node.out.dims)
    return ex, base, cp_saved, out


def admits_cp(graph):
    """True when the model has attention blocks and a known sequence length (cp splits it)."""
    if not graph.blocks or sequence_length(graph) is None:
        return False
    return any(_kv_operands(graph, names) for names in graph.blocks.values())


def cp_degrees(graph, n):
    """cp degrees to try with n devices left after pp and tp: 1, and the divisors of n that split the
    sequence into 2·cp equal chunks."""
    from .divisors import divisors
    if not admits_cp(graph):
        return [1]
    seq = sequence_length(graph)
    return [c for c in divisors(n) if check_sequence(seq, c)]


def _kv_of(ctx, prof, rep, tp_index, tp):
    """kv_saved_per_sample of block `rep` under this profile's splits, once per profile and block type:
    it does not depend on the micro-batch or cp degree, and the bounds ask it for every configuration."""
    memo = prof.__dict__.setdefault("_kv_saved", {})
    key = (rep, tp_index, tp)
    if key not in memo:
        memo[key] = kv_saved_per_sample(ctx.graph, ctx.graph.blocks.get(rep) or [], prof.strategies, tp_index, tp,
                                        ctx.settings)
    return memo[key]


class CPTerms:
    """Per-unit additions of a cp > 1 configuration at micro-batch size `mbs` (samples per cp group)."""

    def __init__(self, ctx, prof, cfg):
        self.fwd, self.bwd, self.act, self.act_sel = {}, {}, {}, {}
        cl = ctx.cluster
        link = cp_link(cfg.cp, cfg.tp, cl.gpus_per_node)
        roles = tuple(prof.roles or ())
        tp_index = roles.index("tp") if "tp" in roles else None
        for u in prof.units:
            if u.kind != "block" or u.rep in self.fwd:
                continue
            ex, base, saved, out = _kv_of(ctx, prof, u.rep, tp_index, cfg.tp)
            # mbs: the samples whose whole sequences this rank's K/V cover; it holds 1/cp of each
            f, b = kv_exchange_time(ex * cfg.mbs, cfg.cp, link, cl)
            self.fwd[u.rep], self.bwd[u.rep] = f, b
            self.act[u.rep] = kv_saved_bytes(saved * cfg.mbs, cfg.cp, local_bytes=base * cfg.mbs / cfg.cp,
                                             out_bytes=out * cfg.mbs / cfg.cp)
            # selective recomputation keeps the projections' outputs (GEMM outputs are never
            # recomputed), this rank's K and V among them, and caches the gathered K/V un-repeated
            # (the repeat is replayed): the gathered K/V come on top of the local ones
            self.act_sel[u.rep] = kv_saved_bytes(ex * cfg.mbs, cfg.cp, local_bytes=0.0,
                                                 out_bytes=out * cfg.mbs / cfg.cp)

    def of(self, unit):
        """(forward s, backward s, saved bytes without recomputation, saved bytes under selective
        recomputation) a unit adds."""
        if unit.kind != "block":
            return 0.0, 0.0, 0.0, 0.0
        r = unit.rep
        return self.fwd.get(r, 0.0), self.bwd.get(r, 0.0), self.act.get(r, 0.0), self.act_sel.get(r, 0.0)
