"""Whether a cluster's figures were measured: a plan priced on an uncalibrated preset says so."""
from __future__ import annotations

from sapp.cluster import PRESETS

# what `sapp calibrate` measures; a cluster that still has every one of them at its preset's value
# was not calibrated (node counts and memory sizes may differ: `a100-80g:nodes=4` is still the preset)
MEASURED = ("peak_flops", "compute_efficiency", "mem_bandwidth", "memory_efficiency", "intra_bw", "intra_latency",
            "op_overhead", "compute_scale", "mem_bw_curve", "op_rates", "collective_fits")


CALIBRATED_MARK = "(sapp calibrate --from-run)"

# How far a GPU preset's datasheet figures are trusted: the largest step-time error of the 28 published runs
# of bench/calibrated_families.py (6 families, Megatron-LM, Megatron-DeepSpeed, Llama 3's stack and
# torchtitan on A100 and H100, each priced pinned to its published configuration on its GPU's preset;
# 2026-12-02; bench/RESULTS.md §21): median 5.4%, worst 22.8% (MT-NLG 530B, -20.5% to -22.8%; torchtitan's 8B
# rows imported from the benchmark's own job file at the H100 SXM peak -11% to -13%; the H100 runs of before
# mid-2024 priced with the attention kernel of their date, bench/published.py).  The worst is what a user
# meets on an unseen engine, so it is the band; the median says what a Megatron-like run usually sees.
UNCALIBRATED_GPU_BAND = 0.228
UNCALIBRATED_GPU_MEDIAN = 0.054
UNCALIBRATED_GPU_RUNS = 28


def calibration_band(cluster_notes) -> float | None:
    """The trust band a from-run calibration wrote into a cluster's notes, as a fraction, or None."""
    import re
    text = str(cluster_notes or "")
    if CALIBRATED_MARK not in text:
        return None
    m = re.search(r"trust band ±([0-9.]+)%", text.rpartition(CALIBRATED_MARK)[2])
    return float(m.group(1)) / 100 if m else None


def trust_note(cluster) -> str | None:
    """How far a prediction on `cluster` is trusted: a from-run calibration's band, or the warning
    for an uncalibrated preset (uncalibrated_note), or None."""
    band = calibration_band(getattr(cluster, "notes", ""))
    if band is not None:
        runs = str(cluster.notes).rpartition("calibrated from ")[2].split(" ", 1)[0]
        return (f"figures calibrated from {runs} measured run(s) of this cluster (sapp calibrate --from-run): "
                f"trust band ±{band:.1%} (the fit's residual on them and their own step-to-step spread)"
                + ("; an exact fit, one run per unknown: other layouts unvalidated" if "exact fit" in
                   str(cluster.notes).rpartition(CALIBRATED_MARK)[2] else ""))
    return uncalibrated_note(cluster)


def uncalibrated_note(cluster) -> str | None:
    """A one-line warning for a prediction from a preset's rough figures, or None when the cluster
    carries measurements (or is not a preset)."""
    preset = PRESETS.get(cluster.name)
    if preset is None or any(getattr(cluster, f, None) != getattr(preset, f, None) for f in MEASURED):
        return None
    if not getattr(cluster, "async_launch", True):
        # the CPU preset is this machine, priced with guesses: the mlp dp2 plan measured 102 ms per
        # step against 21 ms predicted (4.8x)
        return (f"uncalibrated '{cluster.name}' preset: rough figures, not this machine's (an mlp dp2 plan "
                f"measured 4.8x its prediction); run `sapp calibrate --procs {cluster.devices}` and search "
                f"with its JSON for step times that hold")
    return (f"uncalibrated '{cluster.name}' preset: datasheet figures, not measured: {band_text()} "
            f"(median {UNCALIBRATED_GPU_MEDIAN:.0%} over {UNCALIBRATED_GPU_RUNS} published A100 and H100 runs, "
            f"bench/calibrated_families.py); `sapp calibrate` on the machine, or `sapp calibrate --from-run` on "
            f"one measured step of a job, measures them")


def band_text() -> str:
    """What an uncalibrated GPU preset's step is trusted to, as the notes and `sapp search` say it."""
    return f"±{UNCALIBRATED_GPU_BAND:.0%} uncalibrated, published-run validation"


def uncalibrated_band(cluster) -> float | None:
    """UNCALIBRATED_GPU_BAND for an uncalibrated GPU preset (the one uncalibrated_note warns about), else
    None: a calibrated cluster carries its own band (calibration_band), and the CPU preset's error was
    not measured by the published runs."""
    if cluster is None or not getattr(cluster, "async_launch", True) or uncalibrated_note(cluster) is None:
        return None
    return UNCALIBRATED_GPU_BAND
