"""Measurements -> a Cluster: per-device figures from the slowest rank, fitted collectives, the
framework overhead."""
from __future__ import annotations

import statistics

from ..cluster import PRESETS, Cluster
from .config import cfg_elems
from .fit import fit_alpha_beta
from .fsdp import FSDP_UNITS, FSDP_WIDTH
from .machine import _total_ram
from .reference import TINY, graph_launches, reference_prediction
from .workers import measure, reference_seconds


def cluster_from_measurements(raw, name="calibrated", base="cpu") -> Cluster:
    """Turn `measure()` output into a Cluster (per-device figures are the slowest rank's)."""
    ranks, procs = raw["ranks"], raw["procs"]
    base_c = PRESETS[base]
    cuda = ranks[0]["cuda"]
    changes, peaks = _device_figures(ranks, procs, name, base_c, cuda)
    launch, graph_op, overhead = _dispatch(ranks, changes, base_c, cuda)
    _curves_and_op_rates(ranks, changes, overhead, raw)
    fit = _collectives(ranks, procs, changes, base_c) if procs > 1 else None
    notes = _notes(raw, ranks, procs, cuda, min(peaks), changes, launch, graph_op, fit)
    ref_s = reference_seconds(raw)
    if ref_s:
        scale = _compute_scale(raw, ref_s, changes, base_c)
        changes["compute_scale"] = round(scale, 3)
        notes += f", framework overhead x{scale:.2f} (reference block {ref_s * 1e3:.1f} ms measured)"
    if "mem_bw_curve" in changes:
        pts = changes["mem_bw_curve"]
        notes += (f", element-wise {pts[0][1] / 1e9:.0f} GB/s at {pts[0][0] / 3 / 1024:.0f} KB"
                  f" to {pts[-1][1] / 1e9:.0f} GB/s at {pts[-1][0] / 3 / 2 ** 20:.0f} MB per tensor")
    notes += "; single node: inter-node figures copy the intra-node ones"
    changes["notes"] = notes
    return Cluster.from_dict({**base_c.to_dict(), **changes})


def _device_figures(ranks, procs, name, base_c, cuda):
    """(the Cluster fields of one device and its host, each rank's best GEMM rate): the slowest
    rank's GEMM, copy and element-wise rates, memory sizes, dropout draws."""
    peaks, medians, copies, adds = [], [], [], []
    for r in ranks:
        rates = list(r["local"]["gemm_flops"].values())
        peaks.append(max(rates))
        medians.append(statistics.median(rates))
        copies.append(r["local"]["copy_bw"])
        adds.append(r["local"]["add_bw"])
    peak = min(peaks)
    mem_bw = min(copies)
    compute_eff = max(0.05, min(1.0, min(medians) / peak))
    mem_eff = max(0.05, min(1.0, min(adds) / mem_bw))
    h2d = min(r["local"]["h2d_bw"] for r in ranks) if cuda else mem_bw
    changes = {"name": name, "nodes": 1, "gpus_per_node": procs, "peak_flops": peak, "mem_bandwidth": mem_bw,
               "compute_efficiency": round(compute_eff, 3), "memory_efficiency": round(mem_eff, 3), "h2d_bw": h2d}
    ram = _total_ram()
    changes["host_memory"] = ram
    changes["device_memory"] = ranks[0]["device_memory"] if cuda else ram / procs
    changes["host_mem_bandwidth"] = sum(copies) if not cuda else base_c.host_mem_bandwidth
    changes["host_flops"] = sum(peaks) if not cuda else base_c.host_flops
    rng = [r["local"]["rng_rate"] for r in ranks if r["local"].get("rng_rate")]
    if rng:
        changes["rng_rate"] = min(rng)            # slowest rank
    if not cuda:
        changes["precision"] = "fp32"
    return changes, peaks


def _dispatch(ranks, changes, base_c, cuda):
    """Per-op dispatch into `changes` (op_overhead: a graph operator's, update_op_overhead: a bare
    op's); returns (the ranks' launch measurements, the per-graph-op figure or None, a bare op's
    dispatch: what single-op measurements carry and an optimizer update pays; 0 on CUDA)."""
    launch = [r["local"]["launch"] for r in ranks if r["local"].get("launch")]
    if launch:
        # the slowest rank's dispatch, like every other per-device figure (the step waits for it)
        changes["op_overhead"] = max(x["fwd"] for x in launch)
        changes["async_launch"] = bool(cuda)
        sharded = [x["sharded"] for x in launch if x.get("sharded")]
        if sharded:
            changes["sharded_op_overhead"] = max(sharded)
    overhead = changes.get("op_overhead", 0.0) if not cuda else 0.0      # (before graph_op replaces it)
    tiny = [r["local"].get("tiny_s") for r in ranks]
    graph_op = None
    if launch and all(tiny):
        # per launch the cost model counts, a real graph's step costs several bare dispatches (module
        # calls, autograd nodes, the backward's transposes and gradient accumulation); the tiny
        # model's roofline (nearly nothing) comes off first.  Slowest rank, as everywhere
        bare = Cluster.from_dict({**base_c.to_dict(), **changes, "op_overhead": 0.0, "compute_scale": 1.0})
        roof = reference_prediction(bare, TINY)
        graph_op = max(overhead, (max(tiny) - roof) / max(1, graph_launches(TINY)))
        changes["update_op_overhead"] = changes["op_overhead"]
        changes["op_overhead"] = graph_op
    return launch, graph_op, overhead


def _curves_and_op_rates(ranks, changes, overhead, raw) -> None:
    """The element-wise and dropout rate curves and the per-op rate table into `changes`: per size
    (op), the slowest rank, less the serial dispatch `overhead`."""
    for key in ("mem_bw_curve", "rng_curve"):
        curves = [r["local"].get(key) for r in ranks]
        if all(curves):
            # per size, the slowest rank (every rank measures the same sizes).  On a serial device the
            # cost model adds each op's dispatch to its roofline, so take it out of the measured time
            # (but never more than three quarters of it: a tiny op is still not free)
            pts = []
            for i, c0 in enumerate(curves[0]):
                size, rate = c0[0], min(c[i][1] for c in curves)
                t = size / rate
                pts.append((size, size / max(t - overhead, 0.25 * t)))
            changes[key] = tuple(pts)
    tables = [r["local"].get("op_rates") for r in ranks]
    if all(tables):
        # slowest rank per op and direction, less the serial dispatch like the curves above
        rates = {}
        for name in sorted(tables[0]):
            pair = []
            for k in (0, 1):
                rate = min(t[name][k] for t in tables)
                t = 1.0 / rate
                pair.append(1.0 / max(t - overhead / cfg_elems(raw), 0.25 * t))
            rates[name] = pair
        changes["op_rates"] = rates


def _collectives(ranks, procs, changes, base_c):
    """The fitted all_reduce (alpha, beta, rms error), with the other collectives' fits and FSDP2's
    per-unit and per-tensor overheads, into `changes`."""
    ar = ranks[0]["allreduce"]
    sizes = sorted(ar)
    alpha, beta, resid = fit_alpha_beta(sizes, [ar[s] for s in sizes], procs)
    changes.update(intra_latency=alpha, intra_bw=beta, inter_latency=alpha, inter_bw=beta)
    fits = {}
    for kind, times in sorted((ranks[0].get("collectives") or {}).items()):
        ks = sorted(times)
        if len(ks) >= 2:
            if kind == "p2p":       # t = α + B/β is the 2-rank all-gather model at twice the bytes
                a, b, _ = fit_alpha_beta([2 * k for k in ks], [times[k] for k in ks], 2, factor=1.0)
            else:
                a, b, _ = fit_alpha_beta(ks, [times[k] for k in ks], procs, factor=1.0)
            fits[kind] = [a, b]
    if fits:
        changes["collective_fits"] = fits
    fs = [r["local"].get("fsdp") for r in ranks]
    if all(fs):
        from ..costmodel.primitives import collective_time
        fitted = Cluster.from_dict({**base_c.to_dict(), **changes})
        w = FSDP_WIDTH

        def per_unit(key, nbytes):
            comm = (2 * collective_time("all_gather", nbytes, procs, "intra", fitted)
                    + collective_time("reduce_scatter", nbytes, procs, "intra", fitted))
            extra = max(f[key] - f["plain" + key[4:]] for f in fs) / (FSDP_UNITS + 1)   # + the root unit
            return max(0.0, extra - comm)

        u2 = per_unit("fsdp", 4.0 * (w * w + w))
        u6 = per_unit("fsdp6", 4.0 * (w * w + w + w // 2 * 3 + w))
        per_tensor = max(0.0, (u6 - u2) / 4.0)
        changes["fsdp_tensor_overhead"] = per_tensor
        changes["fsdp_unit_overhead"] = max(0.0, u2 - 2.0 * per_tensor)
    return alpha, beta, resid


def _notes(raw, ranks, procs, cuda, peak, changes, launch, graph_op, fit) -> str:
    """The calibrated cluster's notes: what was measured, up to the collectives."""
    notes = (f"calibrated with {procs} {'GPU' if cuda else 'CPU'} process(es), {raw['threads_per_proc']} thread(s) each"
             f"{', ' + ranks[0]['backend'] if ranks[0].get('backend') else ''}"
             f"; GEMM best {peak / 1e9:.1f} GFLOP/s, copy {changes['mem_bandwidth'] / 1e9:.2f} GB/s")
    if "rng_rate" in changes:
        notes += f", dropout {changes['rng_rate'] / 1e6:.0f} M random draws/s"
    if launch:
        notes += (f", op dispatch {max(x['fwd'] for x in launch) * 1e6:.1f} us fwd / "
                  f"{max(x['bwd'] for x in launch) * 1e6:.1f} us bwd per bare op"
                  + (f", {graph_op * 1e6:.1f} us per op of a training graph" if graph_op else "")
                  + (f", {changes['sharded_op_overhead'] * 1e6:.0f} us per sharded-parameter op"
                     if "sharded_op_overhead" in changes else ""))
    if "fsdp_unit_overhead" in changes:
        notes += (f", FSDP2 {changes['fsdp_unit_overhead'] * 1e3:.2f} ms per unit + "
                  f"{changes.get('fsdp_tensor_overhead', 0.0) * 1e3:.2f} ms per parameter tensor per step besides collectives")
    for kind, (a, b) in sorted((changes.get("collective_fits") or {}).items()):
        notes += f", {kind} alpha {a * 1e6:.0f} us beta {b / 1e9:.2f} GB/s"
    if fit:
        notes += f", all_reduce alpha {fit[0] * 1e6:.1f} us beta {fit[1] / 1e9:.3f} GB/s (fit rms error {fit[2] * 100:.0f}%)"
    return notes


def _compute_scale(raw, ref_s, changes, base_c) -> float:
    """The slowest rank's reference step over the cost model's prediction with everything else
    measured, kept within [0.5, 3]."""
    measured_c = Cluster.from_dict({**base_c.to_dict(), **changes})
    predicted = reference_prediction(measured_c)
    if len(raw["ranks"]) > 1:        # the lockstep all-reduce closing each timed step, as a run's loss sync
        from ..costmodel.primitives import scalar_allreduce_time
        predicted += scalar_allreduce_time(len(raw["ranks"]), "intra", measured_c)
    return max(0.5, min(3.0, ref_s / predicted)) if predicted > 0 else 1.0


def calibrate(procs=2, quick=False, timeout_s=120.0, name="calibrated", threads=None):
    """Measure and return (Cluster, raw measurements)."""
    raw = measure(procs=procs, quick=quick, timeout_s=timeout_s, threads=threads)
    return cluster_from_measurements(raw, name=name), raw
