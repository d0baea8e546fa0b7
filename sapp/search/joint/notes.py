"""The plan notes that say why the joint search chose what it chose."""
from __future__ import annotations

from sapp.cluster.trust import trust_note
from ...units import fmt_bytes, fmt_time, plural
from .terms import public_mfu_note


def notes(ctx, res):
    cfg = res.config
    out = [f"searched {res.stats['configs']} configurations: {res.stats['evaluated']} evaluated, "
           f"{res.stats['pruned']} pruned by lower bounds, {res.stats['profiles']} stage profiles from "
           f"{res.stats['searches']} sharding searches"]
    if cfg.pp > 1:
        out.append(f"{cfg.pp} pipeline stages with {cfg.m} micro-batches ({cfg.schedule}"
                   f"{', v=' + str(cfg.v) if cfg.v > 1 else ''}): bubble {res.bubble_s / res.step_time_s:.1%} of the step")
        if any(0 in (s.chunks or ()) for s in res.stages):
            out.append(f"first / last chunk without blocks (Llama 3's interleaved layout): the first / last stage holds "
                       f"{plural(cfg.v - 1, 'block')}, its first / last chunk only what runs before / after the blocks "
                       f"(torch.distributed.pipelining runs a virtual stage without blocks)")
    else:
        out.append("no pipeline: the model's states and activations fit one stage"
                   + (f" with {cfg.m} accumulation steps" if cfg.m > 1 else ""))
    if cfg.ep > 1:
        from .ep import ep_note
        out.append(ep_note(ctx, cfg))
    pol = {}
    for s in res.stages:
        for b, v in s.recompute.items():
            pol[v] = pol.get(v, 0) + 1
    if pol.get("selective") or pol.get("full"):
        out.append("recomputation: " + ", ".join(f"{k} x{v}" for k, v in sorted(pol.items())))
    if cfg.cp > 1:
        out.append(cp_note(ctx, res))
    if cfg.zero:
        over = f"dp x cp = {cfg.dp}x{cfg.cp}" if cfg.cp > 1 else f"dp={cfg.dp}"
        if cfg.rep > 1:         # HSDP: the shard group, its gradient shards all-reduced across the replicas
            over = (f"each of {cfg.rep} HSDP replicas' {cfg.dp_cp} ranks (FSDP2 within the group, each gradient "
                    f"shard all-reduced across the {cfg.rep} replicas)")
        # device memory only: states a placement keeps on the host (host_offload, negative) are not
        # on the device
        states = sum(res.memory[k] for k in ('params', 'grads', 'optimizer'))
        host = -float(res.memory.get("host_offload", 0.0) or 0.0)
        out.append(f"ZeRO-{cfg.zero} over {over}: model states per device {fmt_bytes(states - host)}"
                   + (f" on the device ({fmt_bytes(host)} more per device held in host memory)" if host > 0 else ""))
    pl = res.placement
    if pl is not None and pl.name != "device":
        pr = pl.section.get("predicted", {})
        out.append(f"placement {pl.name}: saves {fmt_bytes(pl.device_bytes_saved)} per device, host work "
                   f"{fmt_time(pr.get('host_s', 0.0))} of which {fmt_time(pl.extra_time_s)} is exposed")
    if len(ctx.best_by_placement) > 1:
        ranked = sorted(ctx.best_by_placement.items(), key=lambda kv: (kv[1][0], kv[0]))
        out.append("placement weighed: " + "; ".join(
            f"{name} best {fmt_time(t)} ({_as_placed(c)})" for name, (t, c) in ranked)
            + f" -> {ranked[0][0]} wins")
    out.append(_OVERLAP_NOTES[getattr(res, "overlap", "none")])
    if getattr(res, "overlap", "none") == "fsdp-units" and cfg.zero == 3:
        out.append("ZeRO-3 all-gathers prefetched one FSDP2 unit ahead (forward and backward): each hidden behind "
                   "the previous unit's compute, a stage's first gather of each pass exposed; the prefetched "
                   "unit's gathered parameters held beside the running one's")
    if getattr(res, "scatter_gather", False):
        out.append(f"stage boundaries scatter/gather (Megatron): each of the tp={cfg.tp} ranks sends 1/{cfg.tp} of "
                   f"the activation ({fmt_bytes(res.boundary_bytes)} per send) and the receiving stage all-gathers "
                   f"it over the tp group; gradients the same way back")
    fb, gb = getattr(res, "boundary_bytes", 0.0), getattr(res, "boundary_grad_bytes", 0.0)
    if cfg.pp > 1 and fb != gb:
        out.append(f"stage boundaries send {fmt_bytes(fb)} forward and {fmt_bytes(gb)} backward per micro-batch and "
                   f"device: tensors without a gradient (e.g. a mask built from an input) cross forward only")
    out.append(f"peak memory {fmt_bytes(res.peak_memory_bytes)} of {fmt_bytes(res.capacity_bytes)} per device")
    if ctx.settings.precision == "fp16-mixed":
        out.append("fp16-mixed (no bf16 on this device): priced at bf16's widths; fp16 needs loss scaling "
                   "(torch.amp.GradScaler), whose skipped steps on overflow are not priced")
    note = trust_note(ctx.cluster)
    if note:
        out.append(note)
    above = public_mfu_note(ctx.cluster, ctx.settings, res)
    if above:
        out.append(above)
    return out


def cp_note(ctx, res):
    """What context parallelism does in this plan and what its K/V exchange costs per step."""
    from .cp import sequence_length
    cfg = res.config
    seq = sequence_length(ctx.graph)
    return (f"context parallel cp={cfg.cp}: each sample's {seq} tokens split into {2 * cfg.cp} chunks, rank r "
            f"holds chunks r and {2 * cfg.cp - 1}-r (even causal work); K/V all-gathered before attention, "
            f"their gradients reduce-scattered; parameters replicated over cp, gradients averaged over "
            f"dp x cp = {cfg.dp * cfg.cp}"
            )
_OVERLAP_NOTES = {
    "none": "gradient sync priced whole after backward (serial device, or one flat all-reduce under TP / pipelines)",
    "ddp-buckets": "gradient sync overlapped with the last backward in DDP's 25 MB buckets; the last bucket is exposed",
    "fsdp-units": "gradient reduce-scatter overlapped per FSDP2 unit with the last backward; the last unit's is exposed",
    "megatron-buckets": ("gradient reduce-scatter overlapped in buckets with the last backward (ZeRO-1: the parameter "
                         "all-gather with the next first forward), as Megatron-Core's distributed optimizer does "
                         "(runtime fused: priced, not what sapp run emits); the last bucket is exposed"),
}


def _as_placed(cfg) -> str:
    """A configuration's degrees without its sequence-parallel flag: whether SP is placed depends on the
    model's ops (a Wide&Deep has none to split by sequence, and its plan says sp false), which the
    placement comparison does not work out; the plan's `parallel.sp` says it for the chosen one."""
    text = cfg.describe()
    return text[:-len(" sp")] if text.endswith(" sp") else text
