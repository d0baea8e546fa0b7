"""A stand-alone placement decision for one data-parallel configuration (no pipeline, no tensor
parallelism, every device holding the whole model): device memory = model states (ZeRO formulas) +
saved activations of one micro-batch, with or without full recomputation of the repeated blocks;
step time = device compute (+ the recomputed forward) + ZeRO-3 parameter gathers + the
placement's exposed host time.  The joint search makes the same choice inside its own
loop; this is what bench/placement.py and the decision tests use, and what `explain` can show.
Pure: no torch."""
from __future__ import annotations

from dataclasses import dataclass, field

from sapp.costmodel import collective_time, compute_time, model_state_bytes, saved_activations
from sapp.errors import InfeasibleError
from sapp.cluster.mesh import Mesh
from sapp.units import fmt_bytes, fmt_time
from sapp.placement.decide import choose, host_infeasible_error, placement_options

MATMUL_LIKE = ("matmul", "conv", "attention", "embedding")


@dataclass
class Decision:
    option: object                 # the chosen PlacementOption
    recompute: dict                # policy -> number of blocks
    step_time_s: float
    compute_s: float               # device compute incl. recomputation
    comm_s: float                  # ZeRO-3 parameter gathers / extra reductions on the device
    device_bytes: float            # per device, after placement
    device_capacity: float
    table: list = field(default_factory=list)   # every (option, recompute) tried, for the report

    @property
    def name(self):
        return self.option.name


def step_compute_s(graph, cluster, samples_per_device) -> float:
    """Forward + backward device compute for `samples_per_device` samples (backward = 2x forward for
    matmul-like ops, 1x for the rest), roofline per op."""
    t = 0.0
    for n in graph.nodes.values():
        mult = 3.0 if n.kind in MATMUL_LIKE else 2.0
        t += compute_time(n.flops * mult, n.bytes * mult, cluster)
    return t * samples_per_device / graph.batch_size


def block_options(graph, cluster, settings):
    """Saved activations of one micro-batch (graph.batch_size samples) on one device: (bytes outside
    the repeated blocks, {block: BlockOption}) with per-block (none, selective, full) bytes and extra
    forward seconds.  "selective" drops what the attention core saves (the s^2 tensors, as the joint
    search's profiles do) and recomputes the core; "full" keeps the block input and recomputes the
    block's forward (during backward one block's activations exist at a time: the caller reserves
    the largest block's as transient)."""
    from sapp.pipeline.profile import attention_core
    from sapp.recompute.solver import BlockOption
    acts = saved_activations(graph, {n: () for n in graph.nodes}, Mesh(()), settings)
    block_of = {n: blk for blk, names in graph.blocks.items() for n in names}
    fwd = {n.name: compute_time(n.flops, n.bytes, cluster) for n in graph.nodes.values()}
    outside, per = 0.0, {b: [0.0, 0.0] for b in graph.blocks}
    cores = {b: attention_core(graph, list(names)) for b, names in graph.blocks.items()}
    for tid, (b, savers) in acts.items():
        blk = block_of.get(savers[0])
        if blk is None:
            outside += b
            continue
        per[blk][0] += b
        if tid.split(":")[0] not in cores[blk]:
            per[blk][1] += b
    opts = {}
    for blk, names in graph.blocks.items():
        last = graph.nodes[names[-1]].out
        full = last.numel * settings.act_bytes(last.dtype)
        opts[blk] = BlockOption((per[blk][0], per[blk][1], full),
                                (0.0, sum(fwd[n] for n in cores[blk]), sum(fwd[n] for n in names)))
    return outside, opts


def _types(graph, opts):
    """Blocks grouped by structure (graph.block_groups), as (count, BlockOption) for the solver."""
    seen, types = set(), []
    for group in graph.block_groups:
        members = [b for b in group if b in opts]
        if members:
            types.append((len(members), opts[members[0]]))
            seen |= set(members)
    for b in sorted(set(opts) - seen):
        types.append((1, opts[b]))
    return types


def decide(graph, cluster, settings, *, dp=1, zero=0, micro_batches=1, pins=None, recompute=True):
    """The fastest placement (with the cheapest per-block recomputation that makes it fit, when
    `recompute`) for `graph` captured at the micro-batch size, dp data-parallel replicas and
    `micro_batches` per step.  Raises InfeasibleError with the numbers when nothing fits (naming the
    host when host memory is the limit)."""
    from sapp.recompute.solver import POLICIES, choose_recompute
    n = graph.param_count()
    st = model_state_bytes(n, dp, zero, settings)
    states = st["params"] + st["grads"] + st["optimizer"]
    compute = step_compute_s(graph, cluster, graph.batch_size * micro_batches)
    comm = 0.0
    link = "inter" if dp > cluster.gpus_per_node else "intra"
    if zero >= 3 and dp > 1:      # gather parameters for forward and backward of every micro-batch
        comm = micro_batches * 2 * collective_time("all_gather", settings.weight_bytes * n, dp, link, cluster)
    outside, bopts = block_options(graph, cluster, settings)
    types = _types(graph, bopts)
    no_rc = sum(o.act[0] for o in bopts.values())
    transient = max((o.act[0] for o in bopts.values()), default=0.0)
    opts = placement_options(graph, list(graph.nodes), cluster, settings, dp=dp, zero=zero,
                             micro_batches=micro_batches, compute_s=compute, pins=pins)
    table, best = [], None
    for o in opts:
        resident = states - o.device_bytes_saved + outside
        if resident + no_rc <= cluster.usable_memory or not types:
            act, extra, policy = no_rc, 0.0, {"none": sum(c for c, _ in types)}
        elif recompute:
            ch = choose_recompute(types, cluster.usable_memory - resident - transient)
            if ch is None:
                act, extra, policy = None, 0.0, {}
            else:
                act = ch.act_bytes + transient
                extra = ch.extra_s * micro_batches
                policy = {p: sum(c[i] for c in ch.counts) for i, p in enumerate(POLICIES)}
        else:
            act, extra, policy = None, 0.0, {}
        fits = act is not None
        need = resident + (act if fits else no_rc)
        t = compute + extra + comm + o.extra_time_s
        table.append({"option": o.name, "recompute": policy, "step_time_s": t, "recompute_s": extra,
                      "extra_time_s": o.extra_time_s, "device_bytes": need, "fits": fits,
                      "host_bytes_per_node": o.host_bytes})
        if fits and (best is None or t < best[0] - 1e-12):
            best = (t, o, policy, extra, need)
    if best is None:
        err = host_infeasible_error(graph, list(graph.nodes), cluster, settings, dp=dp, zero=zero,
                                    micro_batches=micro_batches, compute_s=compute, pins=pins)
        if err is not None:
            raise err
        low = min(r["device_bytes"] for r in table)
        raise InfeasibleError(f"{graph.name} needs at least {fmt_bytes(low)} per device even with host placement "
                              f"and recomputation; the device has {fmt_bytes(cluster.usable_memory)}: "
                              "use more devices, ZeRO or tensor/pipeline parallelism",
                              needed_bytes=low, capacity_bytes=cluster.usable_memory)
    t, o, policy, extra, need = best
    chosen = choose([o], need + o.device_bytes_saved, cluster.usable_memory)
    pol = ", ".join(f"{k} {v}" for k, v in policy.items() if v) or "none"
    chosen.section["predicted"]["reason"] += f"; recompute blocks: {pol}; step {fmt_time(t)}"
    return Decision(chosen, policy, t, compute + extra, comm, need, cluster.usable_memory, table)
