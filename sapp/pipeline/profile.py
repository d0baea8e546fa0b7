"""Per-unit costs of one (dp, tp) stage sub-mesh, the numbers the pipeline partition, the recompute
choice and the joint search work on.

A *unit* is a block (e.g. `layers.3`) or the non-block "glue" around them (prologue: embedding,
epilogue: final norm / head / loss).  The sharding search runs once per (dp, tp) on a *template*
graph (the glue plus one representative block per block group); every block copies the numbers of
its representative.  Memory is exactly affine in the micro-batch size b (c0 + c1 * b, fitted at
b = 1, 2).  Time is not: every op is a roofline max(FLOPs, bytes), so a unit's time is a *convex*
piecewise-linear function of b (memory-bound at small b, compute-bound at large b -- a 2-point fit
at b = 1, 2 under-predicts a large micro-batch several-fold on an MLP).  Times are therefore sampled
at b = 1, 2, 8, 32, ... up to the largest micro-batch the search may use, and evaluated as the max
of the secants between consecutive samples, which for a convex function is its exact piecewise-
linear interpolation.  A profile thus serves every micro-batch size without another search.

The graph cache (`graph_cache`) keeps what a profile computes by what it reads: each sampled batch's
unit numbers, the sp node set and the ZeRO stages' sync and states by (dp, tp, strategies, settings,
cluster, units), the largest micro-batch added only where sparse tables read it.  Profiles of one
search whose largest micro-batches differ, and the searches of one device group at several batch
shares (search/hetero.py), thus share all but their top samples; tests/test_hetero_caches.py checks
that warm caches build the fresh plan."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..costmodel import (collective_time, evaluate_sharding, first_savers, model_state_bytes,
                         param_owners, saved_items)
from ..costmodel.dtypes import ensure_widths, out_bytes
from ..costmodel.evaluate import memo_tables
from ..costmodel.nodes import split_factors
from ..costmodel.torchtitan import loss_backward_bytes, loss_class_shards
from ..costmodel.gradsync import bucketed_sync, fsdp_exposed_copies, grad_sync_group, sparse_gradient, sparse_sync_time  # noqa: F401
from .states import _sparse_grads_delta, unit_states  # noqa: F401
from ..errors import SappError
from sapp.cluster.mesh import Level, Mesh
from ..recompute.modules import dropped, selective_sets
from ..recompute.op_sac import kept_bytes, kept_ops, recompute_seconds
from .boundary import fill_side
from .profile_fit import _fresh, _fresh_unit, fit_units, zero_numbers
from .sp_profile import sp_node_set, sp_out_shards, sp_regather, sp_regather_time
from .units import split_units, template_nodes, template_units

ZEROS = (0, 1, 2, 3)


def sample_points(max_mbs):
    """1, 2, 8, 32, ... (x4), ending exactly at max_mbs when it is larger than 2."""
    pts = [1, 2]
    while pts[-1] * 4 < max_mbs:
        pts.append(pts[-1] * 4)
    if max_mbs > pts[-1]:
        pts.append(int(max_mbs))
    return pts


@dataclass
class Profile:
    dp: int
    tp: int
    mesh: Mesh
    roles: tuple
    units: list
    strategies: dict           # template node -> strategy (at the reference micro-batch)
    template: object           # the template OpGraph (batch = dp)
    rep_of: dict               # block -> representative block
    method: str = ""
    sp: bool = False           # sequence parallelism on the tp level (sapp.search.sp_layout.sp_choice)

    @property
    def n_blocks(self):
        return sum(1 for u in self.units if u.kind == "block")


# ---- mesh roles -------------------------------------------------------------------------------
def stage_mesh(cluster, dp, tp):
    """The sub-mesh of one stage: one dp level (batch dims only) and one tp level (inside a node),
    with their roles.  Collapsing each role to one level loses nothing the roles allow (a dp level
    may only split the batch; a group's link is its slowest) and keeps the sharding search small.
    (None, None) if tp does not fit a node or the stage is not whole nodes / a divisor of one."""
    gpn = cluster.gpus_per_node
    S = dp * tp
    if tp > gpn or gpn % tp or not (gpn % S == 0 or S % gpn == 0):
        return None, None
    levels, roles = [], []
    if dp > 1:
        levels.append(Level(dp, "inter" if S > gpn else "intra"))
        roles.append("dp")
    if tp > 1:
        levels.append(Level(tp, "intra"))
        roles.append("tp")
    return Mesh(tuple(levels)), tuple(roles)


# ---- attention core (selective recompute) -----------------------------------------------------
def attention_core(graph, names):
    """Nodes of a block between the q.k^T matmul (inclusive) and the .v matmul (exclusive): what
    selective recomputation drops (the s^2 tensors).  Empty if the block has no such pair."""
    bmm = [n for n in names if graph.nodes[n].kind in ("matmul", "attention")
           and not graph.nodes[n].params and len(graph.nodes[n].producers) >= 2]
    if len(bmm) < 2:
        return set()
    i0, i1 = names.index(bmm[0]), names.index(bmm[1])
    return set(names[i0:i1])


def _producer(tid):
    if ":in" in tid:
        return None
    return tid.split(":")[0]       # "<producer>:mask", "<producer>:cast><saver>#<i>" (an autocast copy)


def unit_activations(graph, unit_nodes, strategies, mesh, settings, savers, regather=None, saved=None, cls=None):
    """(none, selective, full) activation bytes per device for one unit.  `regather` ({(saver,
    tensor id): shards}): inputs a sequence-parallel region entry keeps as its shard (sp_regather);
    `saved`: saved_items per (node, strategy) already computed for this graph (memo_tables); `cls`:
    {loss: tp ranks its classes are spread over} (costmodel.torchtitan.loss_class_shards)."""
    names = list(unit_nodes)
    inside = set(names)
    core = attention_core(graph, names)
    mods = settings.recompute_modules and graph.nodes[names[0]].block is not None if names else False
    if mods:        # Megatron's named modules (recompute/modules.py) instead of the attention core
        discarded, checkpointed, _ = selective_sets(graph, names, settings.recompute_modules, attention_core)
    none = sel = full = 0.0
    regather = regather or {}
    for n in names:
        node = graph.nodes[n]
        s = tuple(strategies[n])
        got = saved.get((n, s)) if saved is not None else None
        for tid, b in got if got is not None else saved_items(node, s, mesh, settings):
            if savers.get(tid) != n:
                continue
            b /= regather.get((n, tid), (1, 0.0))[0] * (cls.get(n, 1) if cls else 1)
            none += b
            prod = _producer(tid)
            if (not dropped(prod, n, discarded, checkpointed)) if mods else prod not in core:
                sel += b
            if prod is None or prod not in inside:
                full += b
    if settings.op_sac and names and graph.nodes[names[0]].block is not None:
        # torchtitan's op-level policy: the block's input and the outputs it saves (recompute/op_sac.py)
        sel = full + kept_bytes(graph, kept_ops(graph, names), strategies, mesh, settings)
    return none, sel, full


def unit_params(graph, names, strategies, mesh, owners, dp=1):
    """[(local numel, grad-sync group size, link, trainable, sparse)] of the parameters a unit
    accounts for (first user), after tensor sharding.  `sparse` is None, or for an embedding table
    with sparse gradients (nn.Embedding(sparse=True)) the (elements, rows) of gradient one rank
    produces per sample: such a table's gradient holds only the rows the batch touched."""
    out = []
    per_rank = max(graph.batch_size / max(dp, 1), 1e-12)       # samples per dp rank in `graph`
    for n in names:
        node = graph.nodes[n]
        s = tuple(strategies[n])
        f = {}
        for d, lv in zip(s, mesh.levels):
            if d is not None:
                f[d] = f.get(d, 1) * lv.size
        seen = set()
        for o in node.operands:
            if o.param is None or o.param in seen or o.param not in owners.get(n, {}):
                continue
            seen.add(o.param)
            k, link = grad_sync_group(s, mesh, o.dims)
            numel = float(o.numel)
            for d in set(o.dims):
                if d in f:
                    numel /= f[d]
            out.append((numel, k, link, bool(owners[n][o.param]), sparse_gradient(node, f, per_rank)))
    return out


def _unit_numbers(graph, units, strategies, mesh, cluster, settings, zero, dp, acts=True, samples=1.0, roles=None,
                  owners=None, sp=None, memo=None):
    """{unit name: its numbers} at the batch `graph` holds, for the units with operators in `graph`
    (`units`: Units, or their (unit, node names in the template) pairs from template_units, which
    build_profile computes once per search; `owners`: param_owners of the template, the same at
    every batch; `sp`: sp_node_set of these strategies, which reads no batch size: the same at every
    batch; `memo`: a dict kept with `graph` for evaluate_sharding's per-node results)."""
    if units and not isinstance(units[0], tuple):
        units = template_units(graph, units)
    st = dataclasses.replace(settings, zero=zero)
    owners = param_owners(graph) if owners is None else owners
    savers = None
    if acts:        # (per graph, mesh and settings: the same for every layout on that mesh)
        skey = ("savers", mesh, st)
        savers = memo.get(skey) if memo is not None else None
        if savers is None:
            savers = first_savers(graph, mesh, st)
            if memo is not None:
                memo[skey] = savers
    cost = evaluate_sharding(graph, strategies, mesh, cluster, st, owners=owners, savers=savers,
                             activations=acts, totals=False, memo=memo)
    sp = sp_node_set(graph, strategies, mesh, roles) if sp is None else sp
    saved = memo_tables(memo, mesh, cluster, st)[2] if memo is not None else None
    regather = sp_regather(graph, strategies, mesh, roles, st, sp=sp)
    seq = sp_out_shards(graph, strategies, mesh, roles, sp=sp)
    sizes = [lv.size for lv in mesh.levels]
    cls = {n: loss_class_shards(graph.nodes[n], strategies[n], sizes, roles, st) for n in graph.nodes}
    out = {}
    for u, names in units:
        pn = [cost.per_node[n] for n in names]
        core = attention_core(graph, names) if u.kind == "block" else set()
        # the operators' ZeRO-3 gathers (bandwidth only), replaced by the unit's bucket (with its latency)
        pc = sum(d["param_comm_s"] for d in pn) / 2
        params = unit_params(graph, names, strategies, mesh, owners, dp)
        sync, lat, gather = bucketed_sync(params, cluster, st, samples)
        copy = fsdp_exposed_copies(params, cluster, st)     # FSDP2's copies on the compute stream
        fwd = sum(d["fwd_s"] for d in pn) - pc + gather + copy[0]
        rg = sp_regather_time(graph, regather, set(names), mesh, roles, cluster, st)
        bwd = sum(d["bwd_s"] for d in pn) - pc + gather + rg + copy[1]
        act = (unit_activations(graph, names, strategies, mesh, st, savers, regather, saved, cls) if acts
               else (0.0, 0.0, 0.0))
        if st.op_sac and u.kind == "block":
            sel_extra = recompute_seconds(names, kept_ops(graph, names), cost.per_node)
        elif st.recompute_modules and u.kind == "block":
            rerun = selective_sets(graph, names, st.recompute_modules, attention_core)[2]
            sel_extra = sum(cost.per_node[n]["fwd_s"] for n in names if n in rerun)
        else:
            sel_extra = sum(cost.per_node[n]["fwd_s"] for n in core)
        out[u.name] = {
            "fwd": fwd, "bwd": bwd, "act": act, "extra": (0.0, sel_extra, fwd),
            "reshard": sum(d["reshard_s"] for d in pn) + rg,
            "grad_sync": sync, "sync_lat": lat, "param_list": params, "gather": gather, "copy": copy,
            "states": {"params": sum(d["param_bytes"] for d in pn),
                       "grads": sum(d["grad_bytes"] for d in pn) + _sparse_grads_delta(
                           params, st, max(graph.batch_size / max(dp, 1), 1e-12), samples),
                       "optimizer": sum(d["optimizer_bytes"] for d in pn)},
            # sparse tables' weights: outside FSDP, never gathered (emit.sparse)
            "fsdp_exempt": sum(n * st.weight_bytes for n, _, _, tr, sp in params if tr and sp is not None),
            "out": _out_bytes(graph, names, dp, st) / seq.get(names[-1], 1),
            "bwd_live": sum(loss_backward_bytes(graph.nodes[n], split_factors(strategies[n], mesh), st) / cls[n]
                            for n in names),
        }
    return out


def _out_bytes(graph, names, dp, settings):
    """Bytes per device of the unit's output (the tensor a stage boundary after it sends): the
    dp shard of the full tensor.  Without sequence parallelism every tensor-parallel rank sends its
    replica (what the emitted pipeline stage does); with it, its sequence shard (see sp_profile.sp_out_shards)."""
    node = graph.nodes[names[-1]]
    if not node.out.shape:
        return 0.0
    return node.out.numel * out_bytes(node, settings) / dp


def rebatch(graph, batch):
    """graph.rebatch, except for ops whose captured `bytes` are smaller than their parameters (an
    embedding lookup counts the rows it touches, not the table): OpGraph.rebatch keeps parameter
    bytes fixed and scales the rest, which would make those ops' traffic fall with the batch.
    Their bytes scale with the batch instead."""
    out = graph.rebatch(batch)
    if out is graph:
        return out
    r = batch / graph.batch_size
    for name, node in graph.nodes.items():
        pbytes = sum(o.nbytes for o in node.operands if o.param is not None)
        if pbytes and node.bytes < pbytes and any(d.batch for d in node.dims):
            out.nodes[name].bytes = node.bytes * r
    return out


_rebatch = rebatch       # build_profile shadows the name with its cached version


def dp_split(node, dp):
    """The dp level's choice for a node: its first batch dim (sizes are multiples of dp after
    rebatching to dp x micro-batch), or None when it has none (e.g. a mask built from a buffer)."""
    for d in node.dims:
        if d.batch and d.splittable and d.size % dp == 0:
            return d.name
    return None


BLOCK_ENTRY = "@block-entry"     # profile method mark: SP cut at the first block's entry (an HF decoder)


def cut_at_block_entry(prof) -> bool:
    """Whether this profile's sequence parallelism cuts the residual stream where the first block
    takes it in: that block then stays on the first pipeline stage (joint/evaluate._partition)."""
    return BLOCK_ENTRY in (getattr(prof, "method", "") or "")


def stage_strategies(template, mesh, roles, cluster, settings, dp, tp, search_fn, cache=None, rebatched=None,
                     sp=False):
    """Strategies of the template on the dp x tp stage mesh.  The dp level may only split batch
    dims, so it takes each node's batch dim; the tp level is searched once per tp (on the template
    at micro-batch 1, tp level only) and shared by every dp - the sharding search runs at most once
    per tensor-parallel degree."""
    rebatch = rebatched or _rebatch
    method = "data-parallel"
    tp_choice = {}
    if tp > 1:
        key = ("tp", tp)
        if cache is not None and key in cache:
            tp_choice, method = cache[key]
        else:
            tmesh = Mesh((Level(tp, "intra"),))
            res = search_fn(rebatch(template, 1), tmesh, cluster, settings, level_roles=("tp",))
            tp_choice = {n: tuple(s)[0] for n, s in res.strategies.items()}
            method = getattr(res, "method", "")
            if cache is not None:
                cache[key] = (tp_choice, method)
        if sp:      # the same regions, the ops between them split along the sequence (no new search)
            from ..search.sp_layout import sp_with_table
            # priced only where the emitter can place every piece (else this is the plain layout);
            # like the tp choice it depends on tp only: derived once per tp, shared by every dp
            skey = ("sp", tp)
            if cache is not None and skey in cache:
                with_sp, sec = cache[skey]
            else:
                with_sp, sec = sp_with_table(rebatch(template, 1), tp_choice, tp)
                if cache is not None:
                    cache[skey] = (with_sp, sec)
            bad = sec.get("unsupported")
            if not bad:
                # BLOCK_ENTRY: the stream is cut where the first block takes it in
                tp_choice, method = with_sp, method + "+sp" + (BLOCK_ENTRY if sec.get("block_scatter") else "")
            else:
                method += f"+sp-unavailable({bad[0]})"
    t1 = rebatch(template, dp)
    out = {}
    for name, node in t1.nodes.items():
        s = []
        if dp > 1:
            s.append(dp_split(node, dp))
        if tp > 1:
            s.append(tp_choice.get(name))
        out[name] = tuple(s)
    return out, method


def build_profile(graph, cluster, settings, dp, tp, *, search_fn=None, zeros=ZEROS, units=None,
                  strategy_cache=None, fixed_strategies=None, max_mbs=2, graph_cache=None, sp=False):
    """Search the template once on the dp x tp sub-mesh and fit every unit's costs in the
    micro-batch size.  `graph` may be captured at any batch (rebatched here).  `graph_cache`: a
    dict kept across the profiles of one search (same graph and units): the template and its
    rebatched copies, which depend on the batch dp x b only, are built once."""
    mesh, roles = stage_mesh(cluster, dp, tp)
    if mesh is None:
        raise SappError(f"tp={tp} cannot be formed inside a node of {cluster.gpus_per_node} devices")
    units = units if units is not None else split_units(graph)
    gc = graph_cache if graph_cache is not None else {}
    if "template" not in gc:
        tnames = template_nodes(graph, units)
        ensure_widths(graph)     # the template keeps the autocast widths its nodes have in the whole model
        gc["template"] = graph.subgraph(tnames) if len(tnames) < len(graph.nodes) else graph
    template = gc["template"]

    def rebatch(g, n):          # (only ever the template here) cached per batch
        if ("rebatch", n) not in gc:
            gc[("rebatch", n)] = _rebatch(g, n)
        return gc[("rebatch", n)]
    t1 = rebatch(template, dp * 1)
    t2 = rebatch(template, dp * 2)
    base = dataclasses.replace(settings, zero=0)
    if search_fn is None and tp > 1 and fixed_strategies is None:
        from ..search import shard_search
        search_fn = shard_search
    if fixed_strategies is not None:           # re-scoring a plan: its own splits, no search
        strategies, method = _plan_strategies(t1, fixed_strategies, mesh, sp and tp > 1, tp,
                                              lambda: rebatch(template, 1))
    else:
        strategies, method = stage_strategies(template, mesh, roles, cluster, base, dp, tp, search_fn,
                                              strategy_cache, rebatched=rebatch, sp=sp and tp > 1)
    # Two batch sizes at the first ZeRO stage fit the batch-linear terms; the other stages only change
    # batch-independent terms (states, gradient sync, ZeRO-3 gathers), so one evaluation each.
    z0 = zeros[0]
    if ("units", id(units)) not in gc:    # (the same units and template in every profile of a search)
        gc[("units", id(units))] = (units, template_units(template, units), param_owners(template))
    _, tunits, owners = gc[("units", id(units))]
    # gradient sync is per step: a sparse table's touched rows accumulate over the rank's samples
    steps = max(1, max_mbs)
    points = sample_points(max_mbs)
    # A profile whose strategies equal an earlier one's on the same mesh (sequence parallelism
    # unavailable: the same layout as without it; tp = 1) has the same numbers: computed once.
    skey = (dp, tp, tuple(strategies.items()), z0, settings, id(cluster), id(units))
    # `steps` reaches the numbers only through sparse tables' gradients (sparse_gradient): without
    # them the batch-independent numbers below are kept whatever the largest micro-batch
    sparse = gc.get("sparse")
    if sparse is None:
        sparse = gc["sparse"] = any(sparse_gradient(n, {}) is not None for n in template.nodes.values())
    steps_key = steps if sparse else None
    nkey = ("numbers",) + skey[:4] + (steps, tuple(points)) + skey[4:6]
    if nkey in gc:
        first, samples = _fresh(gc[nkey])
    else:
        if ("sp set",) + skey not in gc:
            gc[("sp set",) + skey] = sp_node_set(t1, strategies, mesh, roles)
        sp_set = gc[("sp set",) + skey]

        def sampled(t, acts):
            # One sampled batch's numbers, kept by that batch: profiles of one search whose largest
            # micro-batches differ share their smaller samples, and so do the searches of one device
            # group at its batch shares (sapp/search/hetero.py), whose sample points differ at the top.
            key = ("sample",) + skey + (t.batch_size, acts, steps_key if acts else None)
            if key not in gc:
                memo = gc.setdefault(("cost memo", t.batch_size), {})   # evaluate_sharding's per-node results
                gc[key] = _unit_numbers(t, tunits, strategies, mesh, cluster, settings, z0, dp, acts=acts,
                                        samples=steps if acts else 1.0, roles=roles, owners=owners, sp=sp_set,
                                        memo=memo)
            return {k: _fresh_unit(v) for k, v in gc[key].items()}
        first = (sampled(t1, True), sampled(t2, True))
        # further time samples (activations are affine: no need), see the module docstring
        samples = [first[0], first[1]] + [sampled(rebatch(template, dp * b), False) for b in points[2:]]
        gc[nkey] = _fresh((first, samples))
    num = zero_numbers(first, zeros, cluster, settings, steps, gc, skey + (steps_key,))
    out_units, rep_of = fit_units(units, num, samples, points, zeros, t1, dp)
    # what a stage boundary sends besides the activation (masks built from inputs, ...)
    fill_side(graph, units, out_units, gc, (t1, t2), strategies, mesh, roles, settings, dp)
    return Profile(dp, tp, mesh, roles, out_units, strategies, t1, rep_of, method, sp=bool(sp and tp > 1))


def _plan_strategies(t1, fixed, mesh, sp, tp, template_at_1):
    """(strategies, method) of a plan being re-scored: its own splits of the template's operators,
    checked against the stage mesh; `sp`: where the search cut the stream (at the first block's
    entry), so does the plan."""
    missing = [n for n in t1.nodes if n not in fixed]
    if missing:
        raise SappError(f"plan has no split for operator {missing[0]!r}; regenerate it with `sapp search`")
    strategies = {n: tuple(fixed[n]) for n in t1.nodes}
    bad = [n for n, s in strategies.items() if len(s) != len(mesh.levels)]
    if bad:
        raise SappError(f"operator {bad[0]!r} has {len(strategies[bad[0]])} split entries but the stage mesh has "
                        f"{len(mesh.levels)} levels; fix the plan or regenerate it")
    # a plan says sp only where it placed it: its splits are the SP ones (numbers.boundary_replicated)
    method = "plan+sp" if sp else "plan"
    if sp:
        from ..search.sp_layout import sp_with_table
        method += BLOCK_ENTRY if sp_with_table(template_at_1(), {n: s[-1] for n, s in strategies.items()},
                                               tp)[1].get("block_scatter") else ""
    return strategies, method
