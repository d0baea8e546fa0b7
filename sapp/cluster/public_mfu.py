"""The best model-FLOPs utilisation any public training run has shown, per GPU kind: a plan predicted above
it rests on a corner of the cost model no measurement has visited (issue 54 item 6), and says so.

MFU here is model FLOPs per step (no recomputation) over the step time and the GPU's dense bf16/fp16
datasheet peak (REFERENCE.md section 3), the convention of sapp's own `mfu` on a preset.  Each figure is
the highest one its source prints for the kind; the others beside it are there so a reader sees the
spread, not only the maximum."""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class PublicBest:
    kind: str             # the GPU kind as the note names it
    mfu: float            # fraction of the datasheet peak
    source: str           # where the run is printed (short, for the note)
    peak_flops: float     # the datasheet dense bf16 (V100: fp16) peak the figure is a fraction of


# A100 (312 TFLOP/s): MegaScale (Jiang et al. 2024, arXiv 2402.15627, abstract and its 175B strong-scaling
#   table): 55.2% MFU training a 175B model on 12,288 Ampere GPUs, 1.34x Megatron-LM's on the same job.
#   Beside it: Narayanan et al. 2021 (arXiv 2104.04473, abstract), 1T on 3,072 A100s at 502 PFLOP/s,
#   "52% of theoretical peak" - counted with recomputation's FLOPs, so below 52% in model FLOPs.
# H100 / H800 / H200 (989 TFLOP/s, one Hopper compute die): the Megatron-LM README's H100 weak scaling
#   (REFERENCE.md section 5), 16B at 489.1 TF/GPU = 49.5% of 989 (the README rounds it to 49%; the other
#   rows 41-48%).  Beside it: Llama 3 405B, Dubey et al. 2024 Table 4, 38-43% BF16 MFU on 8,192-16,384
#   H100s.  DeepSeek-V3 (arXiv 2412.19437) trains its H800s in FP8 and prints no MFU: not a bf16 figure.
#   No public H200 or H800 bf16 run above the H100's is cited here; they share its compute, so its figure.
# V100 (125 TFLOP/s fp16): NVIDIA ADLR's "MegatronLM's Supercharged V1.0" (nv-adlr.github.io/MegatronLMV1):
#   a 1.2B GPT-2 baseline at 62.4 TFLOP/s, "48% of the theoretical peak FLOPS for a single GPU in a
#   DGX2-H server" (one GPU; the same post's 8-way model-parallel runs scale 79.6-90.7% of that).
_TABLE = {
    "A100": PublicBest("A100", 0.552, "MegaScale, Jiang et al. 2024: 175B on 12,288 GPUs", 312e12),
    "H100": PublicBest("H100", 0.495, "Megatron-LM README weak scaling: 16B at 489.1 TF/GPU", 989e12),
    "V100": PublicBest("V100", 0.48, "Megatron-LM v1.0 (NVIDIA ADLR): 1.2B at 62.4 TF/GPU", 125e12),
}
# the kinds that share a row: same compute die and datasheet bf16 rate (REFERENCE.md section 3, the h800 preset)
_SAME_AS = {"H800": "H100", "H200": "H100"}

BEST_PUBLIC_MFU = dict(_TABLE)


def gpu_kind(cluster) -> str | None:
    """The GPU kind a cluster is built of, read off its name and then its notes (a preset's notes name
    its GPU, and a calibrated copy keeps them: `h100-80g-calibrated`); None when neither names one."""
    for text in (getattr(cluster, "name", ""), getattr(cluster, "notes", "")):
        for m in re.finditer(r"(?<![a-z0-9])([ahv])(100|200|800)(?![0-9])", str(text or "").lower()):
            kind = (m.group(1) + m.group(2)).upper()
            if kind in _TABLE or kind in _SAME_AS:
                return kind
    return None


def best_public(cluster) -> tuple[str, PublicBest] | None:
    """(the cluster's GPU kind, the best public run on it), or None for a kind the table has no run for."""
    kind = gpu_kind(cluster)
    if kind is None:
        return None
    return kind, _TABLE[_SAME_AS.get(kind, kind)]
