"""Everything fixed for one joint search: the graph's units, pins, caches and per-search constants."""
from __future__ import annotations

import functools

from ...costmodel.batchstats import batch_stat_channels
from ...costmodel.nodes import time_flops
from ...costmodel.primitives import scalar_allreduce_time
from ...errors import SappError
from ...pipeline.profile import build_profile
from ...pipeline.units import split_units
from ...recompute.solver import POLICIES
from .ep import check_overlap_pins


class SearchContext:
    def __init__(self, graph, cluster, global_batch, cons, settings, search_fn, caches=None):
        self.graph, self.cluster, self.B, self.cons, self.settings = graph, cluster, global_batch, cons, settings
        check_overlap_pins(cons, settings)      # Megatron-Core's rules for moe_a2a_overlap, before any pricing
        self.search_fn = search_fn
        shared = _shared(caches, graph, cluster, settings, search_fn)
        if "units" not in shared:
            shared["units"] = split_units(graph)
        self.units = shared["units"]
        self.block_units = [u for u in self.units if u.kind == "block"]
        self.block_names = [u.name for u in self.block_units]
        self.L = len(self.block_units)
        # stage profiles depend on the degrees and the largest micro-batch (below) besides the four
        # `_shared` checks; searches with other pins share them (engines.best_plan)
        self.profiles = shared.setdefault("profiles", {})
        self.used_profiles = set()      # the keys this search asked for (what its notes count)
        self._own_profiles = {}         # profiles under pinned strategies (ctx.fixed) are this search's own
        self.strategy_cache = shared.setdefault("strategies", {})
        self._graph_cache = shared.setdefault("graph", {})
        self.numbers = {}
        self.placements = {}
        self.pin_error = None         # a placement pin placement_options refused (search.py says it)
        self.best_by_placement = {}   # option name -> (step, config) of the best feasible config using it
        # host placement is worth pricing for sparse embedding tables or when the user pins it
        self.placement_relevant = bool(cons.placement) or any(
            getattr(p, "sparse_grad", False) for p in graph.params.values())
        self.cap = cluster.usable_memory
        # the step's closing loss all-reduce: the same for every configuration
        self.loss_sync_s = loss_sync_time(cluster)
        # train-mode batch norms: one micro-batch a step, statistics synced over dp (costmodel.batchstats)
        self.bn_channels = batch_stat_channels(graph)
        # the rules (one micro-batch; dp only in whole modules) hold for every batch-statistics module
        # of the model, also one the example inputs do not run (capture's meta: the emitter refuses
        # by the module tree); "other": a class the emitter cannot sync, so dp = 1 as well
        mods = graph.meta.get("batch_stat_modules") or {}
        # buffers the forward writes from the batch (an EMA: capture/batchy.py) follow the same rules
        # as a batch norm of its own class: nothing may split the batch
        self.batch_buffers = list(graph.meta.get("batch_buffers") or [])
        self.batch_stats = bool(self.bn_channels or mods or self.batch_buffers)
        self.batch_stats_unsynced = "other" in mods.values() or bool(self.batch_buffers)
        # work per sample in device-seconds at the roofline's compute rate: the analytic bound's
        # numerator (the FLOPs the cost model's kernels run: costmodel.nodes.time_flops)
        per = sum(sum(time_flops(n, n.flops)) for n in graph.nodes.values())
        # (x compute_scale: every operator's time is scaled by it, and a calibrated scale < 1 would
        # otherwise put the bound above the real time and prune the optimum)
        # (at the fastest kernel efficiency the cluster names, so a bound stays below every op's time)
        eff = max(cluster.compute_efficiency, *(getattr(cluster, k, 0.0) for k in (
            "attention_efficiency", "attention_bwd_efficiency", "flash_attention_efficiency",
            "flash_attention_bwd_efficiency")))
        if settings.fp8:            # FP8 linears run at the FP8 rate (costmodel/fp8.py)
            eff *= max(1.0, getattr(cluster, "fp8_peak_flops", 0.0) / cluster.peak_flops)
        self.work_per_sample = (per / graph.batch_size / (cluster.peak_flops * eff)
                                * getattr(cluster, "compute_scale", 1.0))
        self.model_flops_per_sample = 3.0 * graph.total_flops() / graph.batch_size
        self.policy_pins = {b: cons.recompute_policy(b) for b in self.block_names} if cons.recompute is not None else {}
        self.stage_pins = cons.stage_starts(self.block_names) if cons.stages else None
        # structurally identical blocks with no per-block pins: the count fast path applies
        reps = {u.rep for u in self.block_units}
        pins = set(self.policy_pins.values())
        self.uniform = (len(reps) == 1 and len(pins) <= 1 and self.stage_pins is None
                        and self._glue_only_at_ends())
        # blocks of several types (DeepSeek-V3's dense layers before its MoE ones): the chunked
        # schedules price each device over the blocks it really holds (interleave.mixed_stages)
        self.mixed_blocks = (len(reps) > 1 and len(pins) <= 1 and self.stage_pins is None
                             and self._glue_only_at_ends())

    def _glue_only_at_ends(self):
        kinds = [u.kind for u in self.units]
        if "block" not in kinds:
            return False
        i0 = kinds.index("block")
        i1 = len(kinds) - 1 - kinds[::-1].index("block")
        return all(k == "block" for k in kinds[i0:i1 + 1]) and i0 <= 1 and i1 >= len(kinds) - 2

    def profile(self, dp, tp, sp=False):
        fixed = getattr(self, "fixed", None)
        store = self.profiles if fixed is None else self._own_profiles
        max_mbs = max(2, self.B // dp)
        key = (dp, tp, sp, max_mbs)
        self.used_profiles.add(key)
        if key not in store:
            store[key] = build_profile(self.graph, self.cluster, self.settings, dp, tp, sp=sp,
                                       search_fn=self.search_fn, units=self.units,
                                       strategy_cache=self.strategy_cache, fixed_strategies=fixed,
                                       max_mbs=max_mbs, graph_cache=self._graph_cache)
        return store[key]

    @functools.cached_property
    def param_owners(self):
        """costmodel.param_owners of the whole graph, once per search (every profile's table split reads it)."""
        from ...costmodel import param_owners
        return param_owners(self.graph)

    @functools.cached_property
    def owned_params(self):
        """[(node, its block, its position in the block, [(param, the param operand's dims)])] for the
        nodes that account for parameters (param_owners), in graph order: what every profile's
        placement.table_split reads, without walking the whole graph per profile."""
        out, pos = [], {}
        for b, names in self.graph.blocks.items():
            for i, n in enumerate(names):
                pos[n] = i
        for name, ps in self.param_owners.items():
            if not ps:
                continue
            node = self.graph.nodes[name]
            pdims = [(p, next((op.dims for op in node.operands if op.param == p), None)) for p in ps]
            out.append((name, node.block, pos.get(name), pdims))
        return out

    def allowed(self, block):
        pin = self.policy_pins.get(block)
        if pin:
            return (pin,)
        lim = self.cons.limits
        got = lim["recompute"] if lim else POLICIES
        # Megatron-Core refuses full recomputation beside --overlap-moe-expert-parallel-comm
        return (tuple(p for p in got if p != "full") or ("none",)) if self.settings.moe_a2a_overlap else got


def _shared(caches, graph, cluster, settings, search_fn) -> dict:
    """The batch-independent caches of a search (the split units, the tp layouts by degree, the
    graph cache: template, rebatched copies, cost memos, sampled unit numbers), kept in `caches`
    when the caller runs several searches of the same graph, cluster, settings and sharding search
    at other global batches (sapp/search/hetero.py: one device group at each batch share).  Every key
    in them names what its value depends on besides those four, so a search with shared caches
    returns what a fresh one would.  A fresh dict without `caches`; refused for another graph,
    cluster, settings or search function (those are not in the keys)."""
    if caches is None:
        return {}
    owner = caches.setdefault("for", (graph, cluster, settings, search_fn))
    if owner[0] is not graph or owner[1] is not cluster or owner[2] != settings or owner[3] is not search_fn:
        raise SappError("internal: shared search caches used for another graph, cluster, settings or search function")
    return caches


def loss_sync_time(cluster) -> float:
    """The emitted step's closing all-reduce of one fp32 loss over every rank (the global-batch loss
    it reports): latency only, ~0.8 ms on gloo, microseconds on NCCL."""
    n = cluster.devices
    if n <= 1:
        return 0.0
    return scalar_allreduce_time(n, "inter" if cluster.nodes > 1 else "intra", cluster)
