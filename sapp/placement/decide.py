"""The placement options of one pipeline stage, and the choice among them."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import ConstraintError, InfeasibleError
from ..units import fmt_bytes, fmt_time
from . import cost as C
from .groups import parse_pins, stage_params
from .schema import device_entry, offload_entry, table_entry

NAMES = ("device", "embedding-host", "optimizer-host", "embedding+optimizer-host")


@dataclass(frozen=True)
class PlacementOption:
    name: str                  # one of NAMES
    device_bytes_saved: float  # per device, vs. everything on the device
    extra_time_s: float        # step time added after overlap with device compute
    host_bytes: float          # host memory per node this stage's devices need
    section: dict = field(default_factory=dict)  # the plan's "placement" section


def _sharers(cluster, dp, tp):
    return max(1, min(cluster.gpus_per_node, dp * tp))


def host_capacity(cluster, dp=1, tp=1) -> float:
    """Host memory per node available to one stage: its devices' share of the node."""
    return cluster.host_memory * _sharers(cluster, dp, tp) / cluster.gpus_per_node


def _offload_keys(graph, stage):
    if stage.all_params:
        return ["*"]
    keys = []
    for g in sorted(stage.groups):
        if g in graph.blocks:
            keys.append(g + ".*")
    in_blocks = tuple(k[:-1] for k in keys)
    keys += sorted(p for p in stage.dense if not p.startswith(in_blocks) or not in_blocks)
    return keys


def placement_options(graph, node_names, cluster, settings, *, dp=1, tp=1, zero=0, micro_batches=1,
                      compute_s=0.0, pins=None, micro_batch_size=None, keep_host_infeasible=False,
                      device_split=None, engine_offloads=False, streamed=True):
    """Placements for the stage made of `node_names`, "device" first when allowed.

    graph: the OpGraph at the per-device micro-batch (or pass `micro_batch_size` to rescale the
    lookup counts from graph.batch_size); dp/tp/zero: the stage's degrees; compute_s: the stage's
    device compute per step (forward + backward over all micro-batches), used for overlap.  device_split: table -> the ways the
    stage's layout splits it over tp (default tp), for the bytes host placement frees.
    engine_offloads: a target engine runs the plan and offloads the optimizer itself (DeepSpeed's
    offload_optimizer, at every ZeRO stage), not sapp's emitter: no ZeRO stage is barred for it.
    streamed: whether offloaded gradients stream to the host during backward (optimizer_offload_cost).
    Options whose host memory exceeds the stage's share of a node are dropped (kept, marked
    predicted.host_fits = false, when keep_host_infeasible).  Pins force placements; a pin that
    cannot be honoured raises ConstraintError, pinned host placement without host memory raises
    InfeasibleError."""
    stage = stage_params(graph, node_names, micro_batch_size)
    pin = parse_pins(pins, graph, stage)
    sharers = _sharers(cluster, dp, tp)
    cap = host_capacity(cluster, dp, tp)
    kw = dict(dp=dp, tp=tp, zero=zero, micro_batches=micro_batches, compute_s=compute_s, sharers=sharers)

    host_tables = [t for t in stage.tables if pin.tables.get(t.name) != "device"]
    forced_tables = any(v == "host" for v in pin.tables.values())
    emb = C.embedding_host_cost(host_tables, cluster, settings, device_split=device_split, **kw) if host_tables else None
    off = None
    if stage.dense:
        n = sum(stage.dense.values())
        local = None if device_split is None else _local_params(stage, device_split, tp)
        off = C.optimizer_offload_cost(n, cluster, settings, groups=len(stage.groups),
                                       largest_group=max(stage.groups.values()), local_params=local,
                                       largest_param=max(stage.dense.values()), streamed=streamed, **kw)
    opt_kind = settings.optimizer if settings.optimizer in ("adam", "adamw") else "adam"

    plans = []   # (name, [HostCost parts], groups)
    if not stage.tables and not stage.dense:      # nothing trainable here: nothing to place
        return [PlacementOption("device", 0.0, 0.0, 0.0, {"groups": {}, "predicted": {}})]
    if not forced_tables and pin.optimizer != "host":
        plans.append(("device", [], {}))
    tgroups = {t.name: table_entry(t.kind) for t in host_tables}
    ogroups = {k: offload_entry(opt_kind) for k in _offload_keys(graph, stage)} if off else {}
    if ogroups:     # the offload is priced for the dense parameters: tables a pattern covers stay put
        ogroups.update({t.name: device_entry() for t in stage.tables})
    if emb and pin.optimizer != "host":
        plans.append(("embedding-host", [("embedding", emb)], tgroups))
    if off and not forced_tables and pin.optimizer != "device":
        plans.append(("optimizer-host", [("optimizer", off)], ogroups))
    if emb and off and pin.optimizer != "device":
        plans.append(("embedding+optimizer-host", [("embedding", emb), ("optimizer", off)], {**ogroups, **tgroups}))
    if pin.optimizer == "host" and not off and emb:
        plans.append(("embedding-host", [("embedding", emb)], tgroups))
    plans, refused = _emittable(plans, zero, engine_offloads)
    if not plans and refused:
        raise ConstraintError(f"placement pins {pins!r} need {refused} at ZeRO-{zero}, which the emitter does not run; "
                              f"{'use ZeRO 0 or 2' if zero in (1, 3) else 'relax a pin'}")
    if not plans:
        raise ConstraintError(f"placement pins {pins!r} leave no placement for this stage "
                              f"(tables: {', '.join(t.name for t in stage.tables) or 'none'}; "
                              f"dense parameters: {len(stage.dense)}); relax a pin")

    opts = []
    for name, parts, groups in plans:
        opts.append(_option(name, parts, groups, sharers, cap))
    summary = {o.name: {"extra_time_s": o.extra_time_s, "device_bytes_saved": o.device_bytes_saved,
                        "host_bytes_per_node": o.host_bytes, "host_fits": o.host_bytes <= cap} for o in opts}
    model = {"overlap_fraction": C.OVERLAP, "backward_share": C.BWD_SHARE, "gather_efficiency": C.GATHER_EFFICIENCY,
             "host_sharers": sharers}
    opts = [replace(o, section={"groups": o.section["groups"],
                                "predicted": {**o.section["predicted"], "alternatives": summary, "model": model}})
            for o in opts]
    fits = [o for o in opts if o.host_bytes <= cap]
    if not fits and not keep_host_infeasible:
        need = min(o.host_bytes for o in opts)
        raise InfeasibleError(_host_msg(need, cap, cluster, sharers, "the pinned host placement"),
                              needed_bytes=need, capacity_bytes=cap)
    return opts if keep_host_infeasible else fits


_LOCAL = {}     # (id(stage), id(device_split), tp) -> (stage, device_split, sum): the joint search asks per config


def _local_params(stage, device_split, tp):
    """Dense parameters one tp rank holds: each divided by the ways the stage's layout splits it
    (memoised per stage, split table and tp: the joint search weighs the same model for many configurations)."""
    key = (id(stage), id(device_split), tp)
    hit = _LOCAL.get(key)
    if hit is not None and hit[0] is stage and hit[1] is device_split:
        return hit[2]
    got = sum(v / device_split.get(p, tp) for p, v in stage.dense.items())
    if len(_LOCAL) >= 256:
        _LOCAL.clear()
    _LOCAL[key] = (stage, device_split, got)
    return got


def _emittable(plans, zero, engine_offloads=False):
    """The plans the emitter runs as priced at this ZeRO stage, and the name of the first it does not.
    With `engine_offloads` the target engine runs them (DeepSpeed's ZeRO-1/2/3 offload_optimizer steps
    each rank's 1/dp partition on its host, as optimizer_offload_cost prices dp > 1): all are kept.
    Under ZeRO-3 it refuses optimizer offload (sapp/emit/checks/plan.py: ZeRO-3-Offload is not emitted);
    under ZeRO-1 host tables run as priced (the device part's optimizer states are sharded over dp by
    sapp/emit/dp/zero1.py, the tables' sparse optimizers live on the host), but an offloaded optimizer
    would keep its whole host state on every rank (OffloadAdam), so offload is not offered there."""
    if engine_offloads:
        bad = []
    elif zero == 1:
        bad = [n for n, _, _ in plans if "optimizer" in n]
    elif zero == 3:
        bad = [n for n, _, _ in plans if "optimizer" in n]
    else:
        bad = []
    return [p for p in plans if p[0] not in bad], (bad[0] if bad else None)


def _option(name, parts, groups, sharers, cap):
    host_s = sum(p.host_s for _, p in parts)
    exposed = sum(p.exposed_s for _, p in parts)       # host resources are shared: no overlap between parts
    saved = sum(p.saved_bytes for _, p in parts)
    link = sum(p.link_bytes for _, p in parts)
    host_node = sum(p.host_bytes for _, p in parts) * sharers
    pred = {"option": name, "host_s": host_s, "link_bytes": link, "saved_bytes": saved,
            "overlap_s": max(0.0, sum(p.overlap_s for _, p in parts)), "exposed_s": exposed,
            "host_bytes_per_node": host_node, "host_capacity_per_node": cap, "host_fits": host_node <= cap,
            "components": {k: {**p.detail, "host_s": p.host_s, "exposed_s": p.exposed_s,
                               "saved_bytes": p.saved_bytes, "host_bytes_per_device": p.host_bytes}
                           for k, p in parts}}
    return PlacementOption(name, saved, exposed, host_node, {"groups": dict(sorted(groups.items())), "predicted": pred})


def _host_msg(need, cap, cluster, sharers, what):
    return (f"{what} needs {fmt_bytes(need)} host memory per node but the stage's {sharers} device(s) have "
            f"{fmt_bytes(cap)} of the node's {fmt_bytes(cluster.host_memory)}; use more nodes, a larger "
            "tp/ZeRO degree, or a cluster with more host_memory")


def require_host_memory(needed_per_node, cluster, *, dp=1, tp=1, what="host placement"):
    """Raise InfeasibleError with the numbers when `needed_per_node` exceeds the stage's host share."""
    cap = host_capacity(cluster, dp, tp)
    if needed_per_node > cap:
        raise InfeasibleError(_host_msg(needed_per_node, cap, cluster, _sharers(cluster, dp, tp), what),
                              needed_bytes=needed_per_node, capacity_bytes=cap)


def host_infeasible_error(graph, node_names, cluster, settings, **kw):
    """For the joint search when no option fits device memory: the InfeasibleError explaining the host
    side (the host placement that saves the most device memory and what host memory it would need),
    or None when that option fits the host (the device is then the limit)."""
    opts = placement_options(graph, node_names, cluster, settings, keep_host_infeasible=True, **kw)
    best = max(opts, key=lambda o: (o.device_bytes_saved, -o.host_bytes))
    cap = host_capacity(cluster, kw.get("dp", 1), kw.get("tp", 1))
    if best.host_bytes <= cap:
        return None
    return InfeasibleError(_host_msg(best.host_bytes, cap, cluster, _sharers(cluster, kw.get("dp", 1), kw.get("tp", 1)),
                                     f"even with {best.name} placement, the stage"),
                           needed_bytes=best.host_bytes, capacity_bytes=cap)


def choose(options, device_bytes, device_capacity):
    """The fastest option whose device memory (device_bytes - saved) fits `device_capacity`; ties go
    to the earlier option (device first).  Its section gets predicted.reason.  None if nothing fits."""
    best = None
    for o in options:
        need = device_bytes - o.device_bytes_saved
        if need <= device_capacity and (best is None or o.extra_time_s < best.extra_time_s):
            best = o
    if best is None:
        return None
    dev = next((o for o in options if o.name == "device"), None)
    if best.name == "device":
        reason = (f"everything fits on the device ({fmt_bytes(device_bytes)} of {fmt_bytes(device_capacity)}); "
                  "host placement would only add time")
    elif dev is not None and device_bytes <= device_capacity:
        reason = (f"{best.name} is faster even though the device fits ({fmt_time(best.extra_time_s)} added)")
    else:
        reason = (f"device-only needs {fmt_bytes(device_bytes)} > {fmt_bytes(device_capacity)}; {best.name} saves "
                  f"{fmt_bytes(best.device_bytes_saved)} per device at {fmt_time(best.extra_time_s)} exposed host time "
                  f"per step ({fmt_time(best.section['predicted']['host_s'])} host work, "
                  f"{fmt_time(best.section['predicted']['overlap_s'])} hidden)")
    sec = dict(best.section)
    sec["predicted"] = {**sec["predicted"], "reason": reason, "device_bytes_needed": device_bytes - best.device_bytes_saved,
                        "device_capacity": device_capacity}
    return replace(best, section=sec)


def merge_sections(sections):
    """One plan "placement" section from the per-stage sections of a pipeline (stage order): group
    entries are united (stages hold disjoint parameters; "*" from a stage holding everything stays);
    predicted keeps each stage's numbers under "stages" and the per-device worst case at top level
    (stages run concurrently, so the slowest stage's exposed host time is what the step sees)."""
    groups, stages = {}, []
    for i, sec in enumerate(sections):
        for k, v in sorted((sec.get("groups") or {}).items()):
            if k in groups and groups[k] != v:
                raise ValueError(f"stages disagree on placement group {k!r}")
            groups[k] = v
        stages.append({"index": i, **{k: v for k, v in (sec.get("predicted") or {}).items()
                                      if k not in ("alternatives", "components", "model")}})
    pred = {}
    if any(s.get("option") for s in stages):
        for key in ("host_s", "exposed_s", "overlap_s", "link_bytes", "saved_bytes", "host_bytes_per_node"):
            pred[key] = max((s.get(key, 0.0) for s in stages), default=0.0)
        pred["stages"] = stages
    return {"groups": dict(sorted(groups.items())), "predicted": pred}
