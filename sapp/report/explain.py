"""`explain(plan) -> str`: why this plan, where the time and memory go, what binds it, what came next."""
from __future__ import annotations

from ..units import plural, fmt_bytes, fmt_count, fmt_time
from ._common import (as_plan, capacity, get, opt, placement_label, recompute_label, stage_memory,
                      throughput)

MEMORY_PARTS = ("params", "grads", "optimizer", "activations")


def _pct(x, total):
    return f"{100.0 * x / total:5.1f}%" if total else "   - "


def time_breakdown(plan) -> dict:
    """Step-time components in seconds: compute, communication (exposed), bubble, host."""
    pr = plan["predicted"]
    return {"compute": float(pr.get("compute_s") or 0.0), "communication": float(pr.get("comm_s") or 0.0),
            "pipeline bubble": float(pr.get("bubble_s") or 0.0), "host work": float(pr.get("host_s") or 0.0)}


def binding_constraint(plan):
    """(name, reason): 'memory' when the fullest stage is at >= 90% of capacity, else the largest
    step-time component."""
    cap = capacity(plan)
    rows = stage_memory(plan)
    if cap and rows:
        idx, peak, _ = max(rows, key=lambda r: r[1])
        if peak >= 0.9 * cap:
            return "memory", (f"stage {idx} uses {fmt_bytes(peak)} of {fmt_bytes(cap)} "
                              f"({100 * peak / cap:.0f}%): faster choices (less recomputation, larger micro-batches, "
                              f"less ZeRO sharding) do not fit")
    parts = time_breakdown(plan)
    step = float(plan["predicted"].get("step_time_s") or 0.0) or sum(parts.values()) or 1.0
    name = max(sorted(parts), key=lambda k: parts[k])
    share = parts[name] / step
    reasons = {
        "compute": "the devices are busy computing; only faster kernels or more devices shorten the step",
        "communication": "exposed communication dominates; a different tp/dp split or placement could hide it",
        "pipeline bubble": "pipeline fill/drain dominates; more micro-batches or fewer stages would shrink it",
        "host work": "host-side work (offloaded optimizer/embeddings) dominates; keep more state on the device",
    }
    label = {"compute": "compute", "communication": "comm", "pipeline bubble": "bubble", "host work": "host"}[name]
    second = max((k for k in sorted(parts) if k != name), key=lambda k: parts[k], default=None)
    if share < 0.5 and second is not None and parts[second] >= 0.2 * step:
        # no one part holds the step: both are named (compute 44% beside 31% host work is not "only kernels")
        return label, (f"{name} is {100 * share:.0f}% and {second} {100 * parts[second] / step:.0f}% of the step: "
                       f"{reasons[name]}; and {reasons[second]}")
    return label, f"{name} is {100 * share:.0f}% of the step: {reasons[name]}"


def _device_rows(rows):
    """Rows of device memory only: where a placement keeps model states on the host (a stage's
    negative host_offload), the states column is what stays on the device (the total less the other
    parts) and the host's share is returned apart (the largest over the stages, 0 when none)."""
    host = max((-float((bd or {}).get("host_offload", 0.0) or 0.0) for _, _, bd in rows), default=0.0)
    if host <= 0:
        return rows, 0.0
    out = []
    for idx, total, bd in rows:
        if bd:
            other = sum(float(v) for k, v in bd.items() if k not in ("params", "grads", "optimizer", "host_offload"))
            bd = {"states": max(total - other, 0.0), "activations": bd.get("activations", 0.0)}
        out.append((idx, total, bd))
    return out, host


def _alt_line(i, alt, best_step):
    par = alt.get("parallel") or {k: alt.get(k) for k in ("dp", "tp", "pp") if k in alt}
    cp = f" cp={par['cp']}" if par and (par.get("cp") or 1) > 1 else ""
    bits = [f"dp={par.get('dp')}{cp} tp={par.get('tp')} pp={par.get('pp')}" + (" sp" if par.get("sp") else "")
            + (f" ep={par['ep']}" if par.get("ep", 1) > 1 else "")
            if par else ""]
    pipe = alt.get("pipeline") if isinstance(alt.get("pipeline"), dict) else {}
    sched = alt.get("schedule", pipe.get("schedule"))
    mb = alt.get("micro_batches", pipe.get("micro_batches"))
    if sched:
        bits.append(str(sched))
    if mb:
        bits.append(f"m={mb}")
    rc = alt.get("recompute")
    if isinstance(rc, dict):
        rc = rc.get("default")
    if rc:
        bits.append(f"recompute={rc}")
    if alt.get("zero") is not None:
        bits.append(f"zero={alt['zero']}")
    pred = alt.get("predicted") if isinstance(alt.get("predicted"), dict) else alt
    st = pred.get("step_time_s")
    desc = " ".join(b for b in bits if b)
    if st is None or not alt.get("feasible", True) and st is None:
        cost = "infeasible"
    else:
        rel = f" ({100 * (st / best_step - 1):+.1f}%)" if best_step else ""
        cost = f"{fmt_time(st)}{rel}"
    mem = pred.get("peak_memory_bytes")
    if mem:
        cost += f", peak {fmt_bytes(mem)}"
    if alt.get("feasible") is False:
        cost += ", does not fit"
    why = alt.get("reason") or alt.get("note") or ""
    return f"  {i}. {desc:<48} {cost}" + (f" - {why}" if why else "")


def explain(plan) -> str:
    plan = as_plan(plan)
    step = float(plan["predicted"].get("step_time_s") or 0.0)
    out = _layout_lines(plan)
    out += [""] + _time_lines(plan, step)
    out += [""] + _memory_lines(plan)
    name, why = binding_constraint(plan)
    out += ["", f"Binding constraint: {name} - {why}"]
    out += _alternative_lines(plan, step) + _unknown_and_note_lines(plan)
    return "\n".join(out) + "\n"


def _layout_lines(plan) -> list:
    """The header: the model, the cluster, the degrees and what each parallelism splits."""
    model, cl, par, pipe = plan["model"], plan["cluster"], plan["parallel"], plan["pipeline"]
    out = []
    n = plan["devices"]
    cname = cl.get("name", "cluster")
    out.append(f"Plan for {model.get('name', '?')} ({fmt_count(model.get('params', 0))} params, global batch "
               f"{model.get('global_batch', '?')}) on {n} x {cname} ({plural(cl.get('nodes'), 'node') if isinstance(cl.get('nodes'), int) else cl.get('nodes')} x {cl.get('gpus_per_node')})")
    levels = get(plan["mesh"], "levels", default=[]) or []
    mesh_s = " x ".join(f"{lv['size']}{'i' if lv['link'] == 'intra' else 'n'}" for lv in levels) or "1"
    cp = par.get("cp", 1)
    cp_s = f" cp={cp}" if cp > 1 else ""
    ep = par.get("ep", 1)
    out.append(f"  parallel  dp={par['dp']}{cp_s} tp={par['tp']} pp={par['pp']}" + (f" ep={ep}" if ep > 1 else "")
               + f"   (stage mesh {mesh_s}; i=intra-node, n=inter-node)")
    if int(par["tp"]) > 1:
        out.append("  sequence parallel " + ("on: norms, dropouts and residual adds split along the sequence in the "
                                             "tp group (region entry all-gather, exit reduce-scatter; activations "
                                             "there 1/tp)" if par.get("sp") else
                                             "off: the ops between tp regions run replicated (all-reduce at each exit)"))
    if cp > 1:
        # the stage mesh's data level is dp x cp: parameters are replicated over both
        out.append(f"  context   cp={cp}: each sample's sequence split over {cp} ranks (load-balanced causal chunks), "
                   f"K/V all-gathered for attention; gradients averaged over dp x cp = {par['dp'] * cp}")
    if ep > 1:
        out.append(f"  experts   each MoE layer's experts over EP groups of {ep} dp ranks (all-to-all dispatch/combine); "
                   f"expert gradients synced over {par['dp'] // ep} expert-DP ranks")
    mbs = pipe.get("micro_batch_size")
    out.append(f"  pipeline  {pipe.get('schedule', 'none')}, {pipe['micro_batches']} micro-batches"
               + (f" of {mbs}" if mbs else "")
               + (f", {pipe.get('virtual_chunks')} virtual chunks" if (pipe.get("virtual_chunks") or 1) > 1 else ""))
    out.append(f"  recompute {recompute_label(plan)}   ZeRO-{plan['zero']}   placement {placement_label(plan)}")
    tp_mods = opt(plan, "tp_modules", {})
    if tp_mods:
        kinds = {}
        for style in tp_mods.values():
            kinds[style] = kinds.get(style, 0) + 1
        out.append("  tensor-parallel modules: " + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items())))
    cons = opt(plan, "constraints", {})
    if cons:
        out.append("  pinned by user: " + ", ".join(f"{k}={cons[k]}" for k in sorted(cons)))
    return out


def _time_lines(plan, step) -> list:
    """Step time, throughput and MFU, then the step's parts and the communication by kind."""
    par, pr = plan["parallel"], plan["predicted"]
    out = []
    tput = throughput(plan)
    head = f"Step time {fmt_time(step)}"
    if tput:
        head += f"   throughput {tput:,.1f} samples/s"
    if pr.get("mfu") is not None:
        head += f"   MFU {100 * float(pr['mfu']):.1f}%"
    out.append(head)
    parts = time_breakdown(plan)
    for name, t in parts.items():
        out.append(f"  {name:<16} {fmt_time(t):>10}  {_pct(t, step)}")
    by_kind = pr.get("comm_by_kind") or pr.get("comm_breakdown") or {}
    if not by_kind:
        # what the joint search reports separately; the rest of comm_s is tensor-parallel resharding
        known = {"dp sync": pr.get("grad_sync_s"), "pp p2p": pr.get("p2p_s")}
        by_kind = {k: float(v) for k, v in known.items() if v}
        rest = float(pr.get("comm_s") or 0.0) - sum(by_kind.values())
        if by_kind and rest > 1e-3 * (float(pr.get("comm_s") or 0.0) or 1.0):
            by_kind["tp reshard"] = rest
    for k in sorted(by_kind):
        out.append(f"    {'comm ' + k:<14} {fmt_time(by_kind[k]):>10}  {_pct(float(by_kind[k]), step)}")
    if int(par["tp"]) > 1 and not any("tp" in k for k in by_kind):
        out.append("    (compute includes the tensor-parallel collectives inside each stage's forward/backward; "
                   "the plan does not split them out)")
    rest = step - sum(parts.values())
    if step and abs(rest) > 0.01 * step:
        label = "other" if rest > 0 else "overlapped"
        out.append(f"  {label:<16} {('-' if rest < 0 else '') + fmt_time(abs(rest)):>10}  {_pct(rest, step)}")
    return out


def _memory_lines(plan) -> list:
    """Memory per device: one row per stage (its parts where the plan has them) against the capacity."""
    pr = plan["predicted"]
    cap = capacity(plan)
    out = [f"Memory per device (capacity {fmt_bytes(cap)})"]
    rows, host = _device_rows(stage_memory(plan))
    parts = ("states", "activations") if host else MEMORY_PARTS
    has_bd = any(bd for _, _, bd in rows)
    header = f"  {'stage':>5}" + ("".join(f" {p:>12}" for p in parts) if has_bd else "") + f" {'total':>12} {'use':>6}"
    out.append(header)
    for idx, total, bd in rows:
        line = f"  {idx:>5}"
        if has_bd:
            line += "".join(f" {fmt_bytes((bd or {}).get(p, 0)):>12}" for p in parts)
        line += f" {fmt_bytes(total):>12} {_pct(total, cap)}"
        if cap and total > cap:
            line += "  OVER CAPACITY"
        out.append(line)
    if not has_bd and isinstance(pr.get("memory"), dict) and not host:
        out.append("  breakdown (peak stage): " + ", ".join(f"{k} {fmt_bytes(pr['memory'][k])}" for k in MEMORY_PARTS if k in pr["memory"]))
    if host:
        out.append(f"  host memory: up to {fmt_bytes(host)} of model states per device (the placement's), not on the device")
    return out


def _alternative_lines(plan, step) -> list:
    alts = opt(plan, "alternatives", [])
    if not alts:
        return []
    return ["", "Next-best alternatives (predicted)"] + [_alt_line(i, alt, step) for i, alt in enumerate(alts[:5], 1)]


def _unknown_and_note_lines(plan) -> list:
    """The ops capture did not know (as capture wrote them) and the plan's notes."""
    out = []
    meta = opt(plan, "model", {}).get("meta")
    unknown = (meta.get("unknown_ops") if isinstance(meta, dict) else None) or []
    # model.meta is free-form in the schema: a hand-edited list of anything is shown only where it has
    # the shape capture writes
    unknown = [u for u in (unknown if isinstance(unknown, list) else []) if isinstance(u, dict)
               and isinstance(u.get("op"), str) and isinstance(u.get("count"), int)
               and all(isinstance(u.get(k), (int, float)) for k in ("flops_share", "bytes_share"))]
    if unknown:
        out.append("")
        out.append("Ops capture does not know (priced at 1 FLOP per output element, split only along the batch)")
        out += [f"  {u['op']:<44} x{u['count']:<4} {100 * u['flops_share']:8.4f}% of FLOPs {100 * u['bytes_share']:8.4f}% of bytes"
                for u in unknown]
    notes = [x for x in opt(plan, "notes", []) if not (unknown and x.startswith("unknown ops"))]
    if notes:
        out.append("")
        out.append("Notes")
        out += [f"  - {x}" for x in notes]
    return out
