"""The plan's pipeline and recompute sections, from the joint search's result (sapp.api.build_plan)."""
from __future__ import annotations


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
    if cfg.schedule == "interleaved" and cfg.v > 1:
        # one entry per virtual stage (chunk c of device i runs as stage c * pp + i); a device's
        # chunks may differ in size (pipeline.partition.chunk_counts), priced by block share
        pp = cfg.pp
        per = {}
        for st in res.stages:
            ch = st.chunks or [len(st.blocks) // cfg.v] * cfg.v
            offs = [sum(ch[:c]) for c in range(cfg.v)]
            per[st.index] = [st.blocks[o:o + n] for o, n in zip(offs, ch)]
        order = [per[j % pp][j // pp] for j in range(pp * cfg.v)]
        for j, blocks in enumerate(order):
            i = j % pp
            st = res.stages[i]
            share = st.chunk_shares[j // pp] if st.chunk_shares else len(blocks) / max(1, len(st.blocks))
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
