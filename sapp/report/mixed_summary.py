"""The summary of a mixed cluster's plan (a plan with `groups`, sapp/plan/mixed.py) that `sapp search --cluster A+B` prints and
`sapp explain` opens with: each group's part (its share and layout, or its stages), what crosses
between the groups, the predicted step and the baselines the plan has to beat."""
from __future__ import annotations

from ..plan.mixed import baselines, members, mode, pipe as pipe_of
from ..units import fmt_time


def summary(doc) -> str:
    pr, base = doc["predicted"], baselines(doc)
    if mode(doc) == "pipeline":
        lines = _pipeline_lines(doc)
        lines += _baselines(base, pr)
        return "\n".join(lines) + "\n"
    gb = doc["model"]["global_batch"]
    lines = [f"mixed-cluster plan for {doc['model']['name']}: global batch {gb} over {doc['devices']} devices "
             f"in {len(members(doc))} groups (data-parallel replicas, uneven shares)"]
    for g in members(doc):
        if g["batch_share"]:
            p = g["parallel"]
            lines.append(f"  group {g['name']}: {g['devices']} devices, share {g['batch_share']}/{gb}, "
                         f"dp={p['dp']} tp={p['tp']} pp={p['pp']}, step {fmt_time(g['step_time_s'])}")
        else:
            lines.append(f"  group {g['name']}: {g['devices']} devices, unused (its share would slow the step)")
    link = doc["cluster"]["link"]
    lines.append(f"  cross-group gradient all-reduce: {fmt_time(pr['cross_group_sync_s'])} over {link['bw'] / 1e9:.4g} GB/s "
                 f"per device")
    lines.append(f"  predicted step {fmt_time(pr['step_time_s'])} ({pr['samples_per_s']:.4g} samples/s)")
    return "\n".join(lines + _baselines(base, pr)) + "\n"


def _baselines(base, pr) -> list:
    lines = []
    for name, t in base["alone"].items():
        lines.append(f"  baseline {name} alone: " + ("does not fit" if t is None else
                                                      f"{fmt_time(t)} ({t / pr['step_time_s']:.3g}x)"))
    u = base["uniform_slowest"]
    lines.append("  baseline all devices as the slowest kind: " + ("does not fit" if u is None else
                                                                     f"{fmt_time(u)} ({u / pr['step_time_s']:.3g}x)"))
    return lines


def _pipeline_lines(doc) -> list:
    pipe, pr = pipe_of(doc), doc["predicted"]
    gb = doc["model"]["global_batch"]
    lines = [f"mixed-cluster plan for {doc['model']['name']}: global batch {gb} over {doc['devices']} devices "
             f"in {len(members(doc))} groups (pipeline stages on the groups, uneven stages)",
             f"  pipeline: {pipe['stages']} stages x {pipe['stage_width']} devices (dp={pipe['stage_width']} tp=1), "
             f"{pipe['micro_batches']} micro-batches of {pipe['micro_batch_size']}, {pipe['schedule']}, ZeRO-{pipe['zero']}"]
    for g in members(doc):
        sts = g["stages"]
        lines.append(f"  group {g['name']}: {g['devices']} devices, {_span([s['index'] for s in sts])}, "
                     f"layers {'/'.join(str(len(s['blocks'])) for s in sts)}")
        for s in sts:
            blk = s["blocks"]
            where = f"{blk[0]}..{blk[-1]}" if len(blk) > 1 else (blk[0] if blk else "no blocks")
            glue = [u for u in s["units"] if u not in blk]
            lines.append(f"    stage {s['index']}: {len(blk)} layers ({where}{', ' + ', '.join(glue) if glue else ''}), "
                         f"fwd {fmt_time(s.get('fwd_s', 0))} bwd {fmt_time(s.get('bwd_s', 0))} per micro-batch"
                         + (f", link send {fmt_time(max(s['link_send_s']))}" if max(s.get('link_send_s') or [0]) > 0 else ""))
    link = doc["cluster"]["link"]
    lines.append(f"  sends over the link between groups: {fmt_time(pr.get('cross_group_send_s', 0))} per micro-batch over "
                 f"{link['bw'] / 1e9:.4g} GB/s per device")
    lines.append(f"  predicted step {fmt_time(pr['step_time_s'])} ({pr['samples_per_s']:.4g} samples/s), "
                 f"bubble {fmt_time(pr.get('bubble_s', 0))}")
    d = baselines(doc).get("data_mode")
    lines.append("  data mode (uneven batch shares): " + ("does not fit" if d is None else
                                                           f"{fmt_time(d)} ({d / pr['step_time_s']:.3g}x)"))
    return lines


def _span(ix) -> str:
    return f"stage {ix[0]}" if len(ix) == 1 else f"stages {ix[0]}-{ix[-1]}"
