"""A joint search's result written as a Plan: its operators, tensor-parallel layout, pipeline stages,
recompute section, settings and predictions (sapp.api.search and the engines' mappings call
build_plan)."""
from __future__ import annotations

from sapp.costmodel.layouts import layout_str, output_layout
from sapp.pipeline.dualpipe import chunk_of, rank_of
from sapp.pipeline.template import template_map
from sapp.plan import SCHEMA, Plan


def operator_section(graph, prof):
    """(operators, tp_modules, tp_layout) of the plan; tp_modules and tp_layout are derived from the
    graph and the searched splits by sapp.search.tp_layout (not from module names)."""
    from sapp.search import tp_layout
    tmap = template_map(graph, prof)
    ops, strategies = {}, {}
    for name, node in graph.nodes.items():
        s = tuple(prof.strategies[tmap[name]])
        strategies[name] = s
        lay = output_layout(node, s)
        ops[name] = {"split": list(s), "out": [layout_str(c) for c in lay], "module": node.module, "kind": node.kind}
    tp_levels = [i for i, r in enumerate(prof.roles or ()) if r == "tp"]
    from sapp.search.sp_layout import sp_nodes, sp_section
    sp = sp_nodes(graph, strategies, tp_levels[0], prof.tp) if tp_levels else set()
    tp_modules, groups, notes = tp_layout.modules(graph, strategies, tp_levels, sp)
    if tp_modules:      # each attention the layout leaves whole, and why (the rest keeps tp)
        notes = notes + [f"tp={prof.tp} keeps the attention {line.replace(': ', ' replicated: ', 1)}"
                         for line in tp_layout.unsplit_attention(graph, prof.tp, tp_modules)]
    section = {"source": "graph", "groups": groups, "notes": notes}
    parts = tp_layout.module_parts(graph, strategies, tp_levels, sp, prof.tp) if tp_modules else {}
    if parts:                       # fused projections split by heads (absent: none, as before)
        section["parts"] = parts
    if sp and tp_modules:           # sequence parallelism: where the emitter puts each piece
        section["sp"] = sp_section(graph, strategies, tp_levels[0], prof.tp, sp)
    return ops, tp_modules, section


def head_module(graph, prof):
    """The module the glue after the last block starts with (its final norm or head): where a stage
    holding the head and loss alone begins (Llama 3's interleaved layout)."""
    epi = next((u for u in reversed(prof.units) if u.kind == "glue"), None)
    if epi is None or prof.units[-1] is not epi:
        return None
    return next((graph.nodes[n].module for n in epi.nodes if graph.nodes[n].module), None)


def pipeline_section(res, devices, graph=None):
    cfg = res.config
    S = devices // cfg.pp
    stages = []
    if cfg.schedule in ("interleaved", "dualpipev") and cfg.v > 1:
        # one entry per virtual stage (chunk c of device i runs as stage c * pp + i; DualPipeV's V:
        # stages i and 2 pp - 1 - i, pipeline.dualpipe.rank_of); a device's chunks may differ in size
        # (pipeline.partition.chunk_counts), priced by block share
        pp = cfg.pp
        per = {}
        for st in res.stages:
            ch = st.chunks or [len(st.blocks) // cfg.v] * cfg.v
            offs = [sum(ch[:c]) for c in range(cfg.v)]
            per[st.index] = [st.blocks[o:o + n] for o, n in zip(offs, ch)]
        where = [(rank_of(cfg.schedule, pp, j), chunk_of(cfg.schedule, pp, j)) for j in range(pp * cfg.v)]
        order = [per[i][c] for i, c in where]
        for j, blocks in enumerate(order):
            i, c = where[j]
            st = res.stages[i]
            share = st.chunk_shares[c] if st.chunk_shares else len(blocks) / max(1, len(st.blocks))
            nxt = next((b[0] for b in order[j + 1:] if b), None)
            if nxt is None and j < len(order) - 1:
                nxt = head_module(graph, res.profile)       # the next chunk holds the head alone
            stages.append({"index": j, "device_stage": i, "blocks": list(blocks), "split_before": nxt,
                           "devices": [i * S, (i + 1) * S],
                           # memory: the whole device's (every chunk it holds), as for a plain stage
                           "predicted": {"fwd_s": st.fwd_s * share, "bwd_s": st.bwd_s * share,
                                         "memory_bytes": st.memory_bytes, "memory": dict(st.memory)}})
        return stages
    for st in res.stages:
        nxt = res.stages[st.index + 1].blocks[0] if st.index + 1 < len(res.stages) else None
        stages.append({"index": st.index, "blocks": list(st.blocks), "split_before": nxt,
                       "devices": [st.index * S, (st.index + 1) * S],
                       "predicted": {"fwd_s": st.fwd_s, "bwd_s": st.bwd_s, "recompute_s": st.recompute_s,
                                     "send_s": st.send_s, "grad_sync_s": st.grad_sync_s,
                                     "in_flight": st.in_flight, "memory_bytes": st.memory_bytes,
                                     "memory": dict(st.memory)}})
    return stages


def recompute_section(res):
    blocks = {}
    for st in res.stages:
        blocks.update(st.recompute)
    counts = {}
    for v in blocks.values():
        counts[v] = counts.get(v, 0) + 1
    default = max(sorted(counts), key=lambda k: counts[k]) if counts else "none"
    return {"default": default, "blocks": {b: p for b, p in sorted(blocks.items()) if p != default}}


def build_plan(graph, cluster, res, *, name, global_batch, constraints, settings, section=None,
               model_args=None) -> Plan:
    """`section`: operator_section(graph, res.profile) when the caller has built it already;
    `model_args`: the settings the model spec was built with (model.args; none: the key is left out)."""
    cfg, prof = res.config, res.profile
    ops, tp_modules, tp_layout = section if section is not None else operator_section(graph, prof)
    mem = res.memory
    sp = bool(cfg.sp and ("sp" in tp_layout or _engine_sp(constraints)))
    # (Megatron's sequence-parallel boundary is its sequence shard: no scatter-gather beside it)
    sg = bool(getattr(res, "scatter_gather", False)) and not (sp and "sp" not in tp_layout)
    placement = {"groups": {}, "predicted": {}}
    if res.placement is not None and getattr(res.placement, "section", None):
        placement = res.placement.section
    data = {
        "schema": SCHEMA,
        "model": {"name": name, "fingerprint": graph.fingerprint(), "params": graph.param_count(),
                  "flops_per_sample": graph.flops_per_sample(), "global_batch": global_batch, "meta": dict(graph.meta),
                  **({"args": dict(sorted(model_args.items()))} if model_args else {})},
        "cluster": cluster.to_dict(),
        "devices": cluster.devices,
        # cp and ep only when used: plans without them load as 1; sp only where a tp group exists
        # (tp = 1 plans keep their old form)
        "parallel": {"dp": cfg.dp, "tp": cfg.tp, "pp": cfg.pp,
                     **({"sp": sp} if cfg.tp > 1 else {}),
                     **({"cp": cfg.cp} if cfg.cp > 1 else {}), **({"ep": cfg.ep} if cfg.ep > 1 else {}),
                     **({"dp_replicate": cfg.rep} if cfg.rep > 1 else {}),
                     **({"etp": cfg.etp} if getattr(cfg, "etp", 0) else {})},
        "mesh": dict(prof.mesh.to_dict(), roles=list(prof.roles or ())),
        "operators": ops,
        "tp_modules": tp_modules,
        "tp_layout": tp_layout,
        "pipeline": {"schedule": cfg.schedule if cfg.pp > 1 else "none", "micro_batches": cfg.m,
                     "micro_batch_size": cfg.mbs, "virtual_chunks": cfg.v,
                     "stages": pipeline_section(res, cluster.devices, graph),
                     # boundary sends: only pipelines (old plans load as false / unknown)
                     **({"scatter_gather": sg} if cfg.pp > 1 and cfg.tp > 1 else {}),
                     **({"boundary_bytes": float(getattr(res, "boundary_bytes", 0.0))} if cfg.pp > 1 else {}),
                     # backward sends, only where they differ (side tensors without gradient)
                     **({"boundary_grad_bytes": float(res.boundary_grad_bytes)}
                        if cfg.pp > 1 and getattr(res, "boundary_grad_bytes", None) is not None
                        and res.boundary_grad_bytes != res.boundary_bytes else {})},
        "recompute": recompute_section(res),
        "zero": cfg.zero,
        "placement": placement,
        "constraints": constraints.to_dict(),
        "settings": {"precision": settings.precision, "optimizer": settings.optimizer,
                     "grad_sync_overlap": settings.grad_sync_overlap, "runtime": settings.runtime,
                     "grad_sync_overlap_rule": getattr(res, "overlap", "none"),
                     **({"moe_imbalance": settings.moe_imbalance} if settings.moe_imbalance != 1.0 else {}),
                     **({"grad_fp32": True} if settings.grad_fp32 else {}),
                     **({"fp8": settings.fp8} if settings.fp8 else {}),
                     **({"recompute_modules": list(settings.recompute_modules)} if settings.recompute_modules else {}),
                     **({"moe_a2a_overlap": True} if settings.moe_a2a_overlap else {}),
                     **({"delay_wgrad": True} if settings.delay_wgrad else {})},
        "predicted": {"step_time_s": res.step_time_s, "peak_memory_bytes": res.peak_memory_bytes,
                      "capacity_bytes": res.capacity_bytes, "mfu": res.mfu, "compute_s": res.compute_s,
                      "comm_s": res.comm_s, "bubble_s": res.bubble_s, "host_s": res.host_s, "optimizer_s": res.optimizer_s, "comm_by_kind": res.comm_by_kind,
                      "grad_sync_s": res.grad_sync_s, "p2p_s": res.p2p_s,
                      "samples_per_s": global_batch / res.step_time_s if res.step_time_s > 0 else 0.0,
                      "model_flops": res.model_flops,      # per step: forward + backward, no recomputation
                      "memory": {k: mem.get(k, 0.0) for k in ("params", "grads", "optimizer", "activations", "transient")}},
        "alternatives": [dict(a) for a in getattr(res, "alternatives", [])],
        "notes": list(res.notes) + tp_layout["notes"] + _capture_notes(graph) + _sp_notes(cfg, constraints, tp_layout),
    }
    return Plan.built(data)


def _engine_sp(constraints) -> bool:
    """Megatron runs --sequence-parallel itself, whatever sapp's emitter can place: a Megatron plan priced with
    sequence parallelism says so, and its export writes exactly that (issue 52: the plan said sp false, the
    file --sequence-parallel, and two notes disagreed)."""
    return getattr(constraints, "target", None) == "megatron"


def _sp_notes(cfg, constraints, tp_layout) -> list:
    if "sp" in tp_layout:
        return []
    if _engine_sp(constraints) and cfg.sp and cfg.tp > 1:
        return ["sequence parallelism is on as Megatron runs it (--sequence-parallel), but sapp found no op of this "
                "model to shard by sequence: its activations are priced unsharded over tp, more than Megatron keeps, and "
                "its stage boundaries as a tp-split send and all-gather"]
    if constraints.sp:
        return ["sequence parallelism was pinned but no op here can run sequence-parallel (or the emitter could not "
                "place it): priced and emitted without it"]
    return []


def _capture_notes(graph) -> list:
    """Ops capture priced without knowing them (never silent: sapp/capture/unknown.py)."""
    from sapp.capture.unknown import unknown_note
    note = unknown_note(graph.meta.get("unknown_ops") or [])
    return [note] if note else []
