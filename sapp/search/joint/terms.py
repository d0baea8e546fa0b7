"""A priced step split into the terms it rests on, and the note a plan carries when its predicted MFU is
above the best any public run has shown on its GPU (issue 54 item 6): a user should see which corner of
the cost model such a promise stands on before sending a job to it."""
from __future__ import annotations

from sapp.cluster.public_mfu import best_public
from sapp.cluster.trust import uncalibrated_note

# the order the terms are listed in, and the words the note and bench/free_gain.py use for them
TERMS = (("compute", "compute"), ("recompute", "recomputation"), ("tp_comm", "exposed TP communication"),
         ("dp_sync", "exposed DP sync"), ("pp_p2p", "pipeline sends"), ("bubble", "bubble"),
         ("other", "rest (loss sync, host work, schedule rounding)"))


def step_terms(res) -> dict:
    """Seconds of `res`'s step by term.  The critical stage (the slowest per micro-batch, the one the
    schedule's busy time counts) gives the recomputation: m x its per-micro-batch recompute_s, taken out
    of compute_s (whose backward includes it).  The optimizer update stays in compute (compute_s holds it).
    "other" is whatever the listed terms leave of the step (loss and batch-statistics sync, host work a
    placement exposes, and the pipeline simulator's difference from max-stage x m + bubble), so the terms
    sum to the step."""
    cfg = res.config
    crit = max(res.stages, key=lambda s: s.fwd_s + s.bwd_s + s.send_s) if res.stages else None
    rc = cfg.m * crit.recompute_s if crit is not None else 0.0
    by = res.comm_by_kind or {}
    out = {"compute": res.compute_s - rc, "recompute": rc, "tp_comm": by.get("reshard", 0.0),
           "dp_sync": by.get("dp_grad_sync", 0.0), "pp_p2p": by.get("pp_p2p", 0.0), "bubble": res.bubble_s}
    out["other"] = res.step_time_s - sum(out.values())
    return out


def datasheet_mfu(res, cluster, peak_flops) -> float:
    """The plan's MFU against the GPU's datasheet peak (a calibrated cluster's peak_flops is the measured
    rate, which would make the comparison with public runs' datasheet MFU read high)."""
    step = res.step_time_s
    return res.model_flops / (step * cluster.devices * peak_flops) if step > 0 and peak_flops else 0.0


def public_mfu_note(cluster, settings, res) -> str | None:
    """The note for a plan predicted above the best public MFU on its GPU (calibrate.public_mfu), naming
    the terms its step rests on; None below it, for a GPU kind the table lacks, or for FP8 linears (the
    table's figures are bf16 runs; a bf16-peak MFU of an FP8 plan is not comparable with them)."""
    found = best_public(cluster)
    if found is None or getattr(settings, "fp8", "") or not res.step_time_s:
        return None
    kind, best = found
    mfu = datasheet_mfu(res, cluster, best.peak_flops)
    if mfu <= best.mfu:
        return None
    t = step_terms(res)
    step = res.step_time_s
    # compute's own rate: the model FLOPs over the compute term alone, what the kernels are assumed to run at
    rate = res.model_flops / (t["compute"] * cluster.devices * best.peak_flops) if t["compute"] > 0 else 0.0
    comm = t["tp_comm"] + t["dp_sync"] + t["pp_p2p"]
    parts = [f"compute {t['compute'] / step:.0%} of the step (its kernels at {rate:.0%} of the datasheet peak)",
             f"exposed communication {comm / step:.0%}", f"bubble {t['bubble'] / step:.0%}",
             f"recomputation {t['recompute'] / step:.0%}",
             f"micro-batch {res.config.mbs}, peak memory {res.peak_memory_bytes / max(res.capacity_bytes, 1):.0%} "
             f"of the device"]
    head = (f"predicted MFU {mfu:.1%} exceeds the best public run on {kind} ({best.mfu:.1%}, {best.source}): "
            f"rests on " + ", ".join(parts))
    if uncalibrated_note(cluster) is not None:
        return head + ("; those are the preset's datasheet figures: calibrate (`sapp calibrate --from-run` on one "
                       "measured step) before trusting it")
    return head + ("; this cluster's figures are its own (calibrated or given in its file), not a preset's, but no "
                   "measured run this fast is public: check one measured step (`sapp run --log-json`) before "
                   "committing to it")
