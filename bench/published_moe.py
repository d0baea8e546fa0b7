"""Published MoE runs for bench/published.py's table (its ROWS registry imports this module's ROWS),
priced there as every row is; `python -m bench.published_moe [--runtime fused|eager]` prices these rows alone
(bench/published.py's table: pinned to the published configuration, and free).

Megatron-Core's Mixtral-8x7B run (Megatron-LM MoE README, "Performance": 64 H100, TP1 EP8 PP4 with
virtual pipeline stages (8 chunks over 4 stages: v = 2), global batch 256, sequence 4096, bf16,
dropless routing; 438-468 TFLOP/s per GPU).  Pinned here: tp 1, pp 4, dp 16, ep 8, interleaved v 2,
16 micro-batches of 1; ZeRO-1 (Megatron's distributed optimizer; the experts' states sharded over
expert-DP).  TF/GPU = the model's FLOPs per step (3 x forward, no
recomputation) / step / GPUs, i.e. the plan's MFU x peak.

DeepSeek-V3's pre-training (DeepSeek-V3 technical report, arXiv 2412.19437, sections 3.2-3.3: 2,048 H800,
PP 16 with DualPipe, EP 64 over 8 nodes, ZeRO-1, FP8 with 1x128 / 128x128 fine-grained scaling, the all-to-all
of one micro-batch hidden behind another's compute; 180K H800 GPU-hours per trillion tokens, section 1 =
1,543 tokens/s/GPU).  Pinned here: tp 1, pp 16, dp 128, ep 64, ZeRO-1, 120 micro-batches of 1 sequence of
4,096 (global batch 15,360, section 4.2), torch's DualPipeV in DualPipe's place (its V holds one copy of the
parameters where DualPipe holds two; the same bidirectional overlap of F and B), Megatron-Core's
--fp8-recipe blockwise (Transformer Engine's Float8BlockScaling, the report's recipe) and its
--overlap-moe-expert-parallel-comm; selective recomputation of what the report recomputes (section 3.2.3)
and Megatron-Core names (--recompute-modules layernorm mla_up_proj moe_act: the RMSNorms, MLA's
up-projections with their rotary embedding, the SwiGLU between the expert GEMMs).  The report states the
layout ran as given (ran_as_pinned: priced whatever its memory; it fits the H800's 80 GB, the fits column)
and saves more than sapp prices (FP8 storage beyond the GEMM inputs, the EMA in host memory).  The zoo's
deepseek-v3 carries MLA, group-limited routing (4 of 8 nodes), the FP8 dispatch and the 3 dense layers before
the 58 MoE ones (the V priced over each rank's real layers: search/joint/interleave.py).  Not modelled: the
multi-token-prediction module (one more layer and head) and the sigmoid gate with its bias (softmax top-8).
"""
from __future__ import annotations

import sys

from bench.published import Row

PUBLISHED_RANGE = (438.0, 468.0)       # TFLOP/s per GPU, Megatron-Core MoE README (Mixtral 8x7B, 64 H100)

ROWS = [Row("Megatron-Core MoE (H100)", "Mixtral-8x7B 64 GPUs t1 ep8 p4 v2", "mixtral-8x7b", {},
            "h100-80g:devices=64", 256,
            {"tp": 1, "pp": 4, "dp": 16, "ep": 8, "schedule": "interleaved", "virtual_chunks": 2,
             "micro_batches": 16, "zero": 1},
            "tf_per_gpu_model", sum(PUBLISHED_RANGE) / 2, "Megatron-LM MoE README (438-468 TF/GPU)",
            note="dropless, balanced routing (moe_imbalance 1.0); ZeRO-1 = the distributed optimizer"),
        Row("DeepSeek-V3 (H800)", "DeepSeek-V3 2048 GPUs t1 ep64 p16 dualpipe", "deepseek-v3", {"s": 4096},
            "h800:nodes=256", 15360,
            {"tp": 1, "pp": 16, "dp": 128, "ep": 64, "schedule": "dualpipev", "micro_batches": 120, "zero": 1,
             "recompute": "selective"},
            "tokens_per_gpu", 1e12 / (180e3 * 3600), "DeepSeek-V3 report (180K H800 GPU-hours / 1T tokens)",
            note="FP8 blockwise, all-to-all overlapped, RMSNorm, MLA up-projections and SwiGLU recomputed (the "
                 "report's settings); DualPipeV for DualPipe; MTP not modelled",
            settings={"fp8": "blockwise", "moe_a2a_overlap": True,
                      "recompute_modules": ("layernorm", "mla_up_proj", "moe_act")},
            ran_as_pinned=True)]


def main(argv=()):
    """bench/published.py's table of these rows alone."""
    from bench.published import section
    section(None, argv[argv.index("--runtime") + 1] if "--runtime" in argv else "fused", rows=ROWS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
