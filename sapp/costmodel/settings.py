"""Training precision / optimizer settings the cost model prices model states and activations with.

Runtime profiles (`CostSettings.runtime`, plan `settings.runtime`, `sapp search --runtime`): one named
setting for what the training program runs, never a per-row correction (RUNTIMES below).  A published
Megatron run cannot be priced with eager torch's passes and fp32 softmax (Korthikanti 2022 Table 4's
22B layer: eager 29.5 ms, fused 19.0 ms against 19.6 published).  Under "fused" every float activation
is priced in the half precision except the loss: Megatron-Core's vocab-parallel cross entropy casts
the logits to fp32 and runs pass by pass (nodes.megatron_cross_entropy_bytes); its distributed
optimizer overlaps the parameter all-gather with the next step's first forward and the
reduce-scatter with the last backward (gradsync rule "megatron-buckets").  sapp's emitter runs
"eager": its manifest records that, so emitting a "fused" plan is a one-line mismatch (allowed with
`--allow-mismatch`, re-priced as eager)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import SappError
from sapp.capture.ir import DTYPE_BYTES

_FLOAT = ("float64", "float32", "float16", "bfloat16")
PRECISIONS = ("bf16-mixed", "fp16-mixed", "fp32")
# FP8 linear layers (costmodel/fp8.py): "tensorwise" (torchao's Float8Linear as torchtitan's float8
# converter runs it: dynamic per-tensor scales, an amax pass and a cast per operand and step) or
# "delayed" (Transformer Engine's --fp8-recipe delayed in Megatron-LM: the scale from an amax history,
# the amax taken inside the cast); "tensorwise-tp": "tensorwise" with torchao's float8 tensor-parallel
# styles (torchtitan's enable_float8_tensorwise_tp: the gathers move fp8); "blockwise" (Transformer Engine's
# Float8BlockScaling, --fp8-recipe blockwise: DeepSeek-V3's 1x128 / 128x128 tiles).  "" = no FP8.
FP8_RECIPES = ("tensorwise", "tensorwise-tp", "delayed", "blockwise")
# recipes named by the engines that sapp refuses in one line, and why
FP8_REFUSED = {"mxfp8": "mxfp8 (1x32 blocks with e8m0 scales) runs on Blackwell's tensor cores only, not on Hopper, "
                        "and sapp prices no Blackwell FP8 path; use blockwise (DeepSeek-V3's 1x128 tiles) or delayed"}
# The runtime a plan is priced for (the module docstring says why):
#   "eager": what sapp's emitter runs - torch eager ops under torch.autocast (fp32 softmax / norms /
#            losses, fp32 spreading through element-wise ops), one kernel per operator;
#   "fused": what Megatron-Core runs - fused point-wise chains (scale-mask-softmax, bias-dropout-add,
#            bias-GeLU, bias-SwiGLU keeping only its input, rotary; costmodel.fusion: fewer launches and
#            memory passes) and every float
#            activation in the half precision (as autocast_fp32=False).  Flash attention (SDPA) is priced
#            as the fused kernel in both: it is what torch dispatches on a GPU too.
#   "fused+tp-overlap": "fused" with Megatron-Core's `--tp-comm-overlap`: tensor-parallel collectives
#            pipelined against their linear layers' GEMMs (costmodel.tp_overlap).
#   "torchtitan": what torchtitan runs (its current release, 0.3, as sapp exports it: eager ops, compile
#            and CUDA graphs off, attention torch's varlen FlashAttention, FlashAttention-3 on Hopper:
#            the cluster's flash_attention figures): FSDP2's MixedPrecisionPolicy casts
#            the weights to bf16 and no autocast runs (utils.maybe_enable_amp), so every float activation
#            is bf16 except the loss (cross_entropy_loss: `pred.float()`); gradients are reduced in fp32
#            (training.mixed_precision_reduce, whose only value is "float32"); "selective" recomputation
#            is torchtitan's op-level policy (sapp/recompute/op_sac.py), not sapp's attention core; its
#            eager RMSNorm and loss kernels, the loss backward's memory, vocab-parallel loss under tp,
#            the foreach AdamW update and FSDP2's copies around its collectives: costmodel/torchtitan.py.
#   "torchtitan-0.2.2": "torchtitan" as its 0.2.2 release runs on a current torch: attention is SDPA
#            (is_causal), which torch dispatches to cuDNN's kernel on Hopper: the cluster's attention figures.
#   "torchtitan-2412": "torchtitan-0.2.2" on the stack of torchtitan's published Llama 3.1 benchmark (torchtitan
#            9dec370, torch of Dec 2024): besides, its eager fp32 RMSNorm and SDPA's FlashAttention-2 on
#            Hopper, where a current stack runs a fused RMSNorm kernel (costmodel/torchtitan.py).  The
#            profile `sapp import` reads off a torchtitan TOML of that schema (sapp/engines/torchtitan_2412.py).
#   "torchtitan-2412+compile": "torchtitan-2412" with torch.compile on each block (that schema's
#            training.compile): inductor fuses the blocks' RMSNorm; SDPA still FlashAttention-2.
#   "torchtitan-0.2.2+compile": "torchtitan-0.2.2" with [compile] on for "model" (each block compiled):
#            its FP8 casts compiled (costmodel/fp8.py; a current stack's norm is fused either way).
#   (a profile ending "+compile" prices torchao's FP8 casts as inductor runs them, costmodel/fp8.py)
RUNTIMES = ("eager", "fused", "fused+tp-overlap", "torchtitan", "torchtitan-0.2.2", "torchtitan-0.2.2+compile",
            "torchtitan-2412", "torchtitan-2412+compile")
# Megatron-Core's --recompute-modules that sapp prices (sapp/recompute/modules.py)
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts")
TORCHTITAN_RUNTIMES = ("torchtitan", "torchtitan-0.2.2", "torchtitan-0.2.2+compile", "torchtitan-2412",
                       "torchtitan-2412+compile")
# Optimizer state bytes per parameter, (mixed precision: includes the fp32 master copy, fp32).
# "adam-bf16-master": DeepSpeed's bf16.bf16_master_weights_and_grads (a bf16 master, fp32 moments: 2 + 8);
# "adam-bf16-states": with bf16_optimizer_states too (master and moments in bf16: 2 + 2 + 2).
_OPT_BYTES = {"adam": (12, 8), "adamw": (12, 8), "sgd": (8, 4), "sgd-nomomentum": (4, 0), "adagrad": (8, 4),
              "adam-bf16-master": (10, 8), "adam-bf16-states": (6, 8),
              # pure bf16 training (torchtitan's training.dtype bfloat16): no master, Adam's moments in bf16
              "adam-bf16": (4, 8)}


@dataclass(frozen=True)
class CostSettings:
    precision: str = "bf16-mixed"       # "bf16-mixed" | "fp16-mixed" | "fp32"
    optimizer: str = "adam"
    zero: int = 0                       # ZeRO stage 0..3 over each parameter's grad-sync group
    grad_sync_overlap: float = 0.0      # fraction of gradient synchronisation hidden behind backward
    # bf16-mixed activations: True = widths as torch.autocast runs them (softmax / layer_norm / losses
    # in fp32, fp32 spreading through element-wise ops; costmodel.dtypes), what sapp emits;
    # False = every float activation in bf16 (fused half-precision kernels, Megatron's formulas).
    autocast_fp32: bool = True
    # What dropout keeps for backward (Cluster.fused_dropout): False = a 1-byte bool mask (the fused
    # kernel of GPUs), True = the scaled noise at the input's width (a CPU's unfused dropout).
    dropout_noise: bool = False
    runtime: str = "eager"              # "eager" | "fused" (RUNTIMES above)
    # MoE under expert parallelism: the busiest EP rank's routed rows over the mean (dropless routing;
    # costmodel/moe.py).  1.0 = balanced routing
    moe_imbalance: float = 1.0
    # Gradients held and reduced in fp32 beside half-precision weights: Megatron-LM's DDP main_grads
    # under --bf16 without --grad-reduce-in-bf16 (or --accumulate-allreduce-grads-in-fp32), an fp32
    # buffer of every local gradient that the data-parallel reduce moves at 4 bytes an element
    grad_fp32: bool = False
    fp8: str = ""                       # FP8 linear layers: "" | FP8_RECIPES
    # "selective" recomputation of Megatron-Core's named modules (--recompute-modules, sorted;
    # sapp/recompute/modules.py); () = the attention core, sapp's selective (Megatron's core_attn)
    recompute_modules: tuple = ()
    # Megatron-Core's --overlap-moe-expert-parallel-comm: the combined 1F1B runs one micro-batch's forward
    # beside another's backward, each one's MoE all-to-alls hidden behind the other's compute (priced in
    # search/joint/ep.py from pipeline/overlap.py's pairs); delay_wgrad: --delay-wgrad-compute, the expert
    # weight-gradient GEMMs run beside their own backward dispatch (widening its window)
    moe_a2a_overlap: bool = False
    delay_wgrad: bool = False

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise SappError(f"precision {self.precision!r} is not supported; use 'bf16-mixed', 'fp16-mixed' or 'fp32'")
        if self.optimizer not in _OPT_BYTES:
            raise SappError(f"optimizer {self.optimizer!r} is not supported; use one of {', '.join(_OPT_BYTES)}")
        if self.zero not in (0, 1, 2, 3):
            raise SappError(f"zero stage must be 0, 1, 2 or 3, got {self.zero!r}")
        if not 0.0 <= self.grad_sync_overlap <= 1.0:
            raise SappError(f"grad_sync_overlap must be in [0, 1], got {self.grad_sync_overlap!r}")
        if isinstance(self.moe_imbalance, bool) or not isinstance(self.moe_imbalance, (int, float)) or not (
                1.0 <= self.moe_imbalance <= 64.0):
            raise SappError(f"moe_imbalance must be a number in [1, 64] (busiest EP rank over the mean), got {self.moe_imbalance!r}")
        if not isinstance(self.autocast_fp32, bool):
            raise SappError(f"autocast_fp32 must be True or False, got {self.autocast_fp32!r}")
        if not isinstance(self.grad_fp32, bool):
            raise SappError(f"grad_fp32 must be True or False, got {self.grad_fp32!r}")
        if self.fp8 in FP8_REFUSED:
            raise SappError(f"fp8 recipe {self.fp8!r}: {FP8_REFUSED[self.fp8]}")
        if self.fp8 not in ("",) + FP8_RECIPES:
            raise SappError(f"fp8 recipe {str(self.fp8)[:40]!r} is not priced; use one of {', '.join(FP8_RECIPES)}")
        if self.fp8 and not self.mixed:
            raise SappError(f"fp8 linear layers run beside bf16 mixed precision, not {self.precision}; use bf16-mixed")
        if self.runtime not in RUNTIMES:
            raise SappError(f"runtime {self.runtime!r} is not a runtime profile; use one of {', '.join(RUNTIMES)}")
        if not isinstance(self.moe_a2a_overlap, bool) or not isinstance(self.delay_wgrad, bool):
            raise SappError("moe_a2a_overlap and delay_wgrad must be True or False")
        if self.delay_wgrad and not self.moe_a2a_overlap:     # Megatron-Core's TransformerConfig rule
            raise SappError("delay_wgrad (--delay-wgrad-compute) needs moe_a2a_overlap (--overlap-moe-expert-parallel-comm)")
        if self.moe_a2a_overlap and not self.mixed:
            raise SappError(f"moe_a2a_overlap runs in bf16 or fp16 only (Megatron-Core's rule), not {self.precision}; "
                            f"use bf16-mixed")
        rm = self.recompute_modules
        if not isinstance(rm, tuple) or any(m not in RECOMPUTE_MODULES for m in rm) or list(rm) != sorted(set(rm)):
            raise SappError(f"recompute_modules must be a sorted list of {', '.join(RECOMPUTE_MODULES)}, "
                            f"got {str(rm)[:60]!r}")

    @property
    def fused(self) -> bool:
        """Point-wise chains run fused (costmodel.fusion)."""
        return self.runtime in ("fused", "fused+tp-overlap")

    @property
    def tp_overlap(self) -> bool:
        """Tensor-parallel collectives overlap their GEMMs (costmodel.tp_overlap)."""
        return self.runtime == "fused+tp-overlap"

    @property
    def mixed(self) -> bool:
        """Half-precision compute with fp32 master weights: bf16, or fp16 on GPUs without bf16 (V100),
        priced at the same widths (fp16 adds loss scaling: a multiply of the loss and an unscale
        pass over the gradients, negligible next to the step, and skipped steps on overflow)."""
        return self.precision in ("bf16-mixed", "fp16-mixed")

    @property
    def autocast(self) -> bool:
        """Activation widths follow torch.autocast (some activations fp32), see costmodel.dtypes; the
        fused runtime keeps every float activation in the half precision."""
        return self.mixed and self.autocast_fp32 and not self.fused and not self.torchtitan

    @property
    def loss_fp32(self) -> bool:
        """Half-precision activations but the loss computed on an fp32 copy of the logits (Megatron-Core's
        vocab-parallel cross entropy; torchtitan's `pred.float()`)."""
        return self.mixed and (self.fused or self.torchtitan)

    @property
    def op_sac(self) -> bool:
        """"selective" recomputation is torchtitan's op-level policy (sapp/recompute/op_sac.py)."""
        return self.torchtitan

    @property
    def torchtitan(self) -> bool:
        """One of the torchtitan runtime profiles (either era)."""
        return self.runtime in TORCHTITAN_RUNTIMES

    @property
    def weight_bytes(self) -> int:
        return 2 if self.mixed else 4

    @property
    def grad_bytes(self) -> int:
        return 2 if self.mixed and not self.grad_fp32 else 4

    @property
    def reduce_bytes(self) -> int:
        """Bytes per gradient element the data-parallel reduction moves: the gradient's width, except
        under torchtitan, whose FSDP2 reduce_dtype (and DDP's fp32 gradients under autocast) is float32.
        The held gradient totals are unchanged: FSDP2 keeps fp32 sharded weights and gradients beside
        Adam's two moments, the 2 + 2 + 12 bytes per parameter sapp prices."""
        return 4 if self.torchtitan else self.grad_bytes

    @property
    def optimizer_bytes(self) -> int:
        return _OPT_BYTES[self.optimizer][0 if self.mixed else 1]

    def act_bytes(self, dtype: str) -> int:
        """Bytes per element of an activation of `dtype` at this precision: floats are stored in the
        compute precision, integer ids and masks keep their own width.  Under autocast a float
        activation's width depends on the op that made it: use costmodel.dtypes instead."""
        if dtype in _FLOAT:
            return 2 if self.mixed else 4
        return DTYPE_BYTES.get(dtype, 4)

    def is_float(self, dtype: str) -> bool:
        return dtype in _FLOAT or dtype not in DTYPE_BYTES
