"""Every training argument of Megatron-LM core_v0.16.1, classified for `sapp import --from megatron`.

A flag is one of:
  "priced"                   read by megatron.parse (or megatron_model) and priced as it says;
  ("refused", what)          a switch: refused in one line when present (it changes the step in a way
                             sapp does not price: `what`);
  ("refused", what, ok)      a flag with a value: refused in one line unless the value is one of `ok`
                             (Megatron's default among them: the default is what sapp prices);
  ("rejected", why)          a deprecated flag Megatron-LM's own validate_args rejects (or exits on);
  ("irrelevant", why)        no change to the step sapp prices, with the reason.
A flag Megatron-LM's parser does not have (not in FIELDS) is refused: Megatron would reject the file.

The list of flags is Megatron-LM's own parser at core_v0.16.1 (add_megatron_arguments: its
`add_argument` calls and the dataclass fields ArgumentGroupFactory turns into flags), stored in
tests/data/megatron_core_v0.16.1_args.json by bench/megatron_arg_list.py; pretrain_gpt.py adds
NVIDIA ModelOpt's flags only when ModelOpt is installed, and those are refused as unknown.
tests/test_engines_megatron_fields.py fails on a flag of that list missing here, a flag here not in
it, a refused value set that leaves out Megatron's default, or a refusal longer than one line."""
from __future__ import annotations

import re

from .mapping import EngineError

VERSION = "core_v0.16.1"
P = "priced"


def _fam(kind, flags: str) -> dict:
    return {f: kind for f in flags.split()}


def _read_only(what):
    return ("irrelevant", f"read only with {what}, which is refused")


_LOG = ("irrelevant", "logging, monitoring and profiling output: no work inside the priced step")
_CKPT = ("irrelevant", "checkpoint saving and loading between steps")
_DATA = ("irrelevant", "the data source, split and loader (overlapped with the step)")
_TOK = ("irrelevant", "tokenizer files and settings (the vocabulary size is --vocab-size, priced)")
_LR = ("irrelevant", "the learning-rate and weight-decay schedule: no work inside a step")
_OPT_HP = ("irrelevant", "optimizer hyperparameters: the same update work per step")
_INIT = ("irrelevant", "parameter initialization and random seeds before training")
_RUN = ("irrelevant", "run bookkeeping (length, exit, restarts, timeouts, checks between steps)")
_INFER = ("irrelevant", "inference and text generation settings: not a training step")
_OTHER_MODEL = ("irrelevant", "settings of another model family (BERT/T5/vision/retrieval): pretrain_gpt.py reads none")
_RL = _read_only("reinforcement learning (--perform-rl-step)")
_FP4 = _read_only("FP4 training (--fp4-format)")
_TPO = ("irrelevant", "how Transformer Engine's userbuffers split and pipeline the collectives --tp-comm-overlap "
                      "overlaps (priced as the fused+tp-overlap runtime's overlap): not modelled separately")
_FUSION = ("irrelevant", "an element-wise kernel fusion (bias+activation, bias+dropout+add, rope, masked softmax of "
                         "the unfused attention path): the same GEMMs and activations, not modelled separately")
_ROUTE = ("irrelevant", "which experts a token picks and the router's own arithmetic (a gate a few columns wide): "
                        "sapp prices balanced routing over the experts")
_BUCKET = ("irrelevant", "communication buckets, launch alignment and communicator setup: the same bytes reduced or "
                         "gathered per step; the transient buckets are not modelled")
_ACT = ("irrelevant", "an element-wise detail of rope or the activation: the same GEMMs and activations")

FIELDS = {
    # ---- parallelism, batch, schedule and layout: priced -------------------------------------------------
    **_fam(P, "--tensor-model-parallel-size --pipeline-model-parallel-size --context-parallel-size "
              "--expert-model-parallel-size --expert-tensor-parallel-size --sequence-parallel --cp-comm-type "
              "--num-layers-per-virtual-pipeline-stage --num-virtual-stages-per-pipeline-rank "
              "--decoder-first-pipeline-num-layers --decoder-last-pipeline-num-layers --pipeline-model-parallel-layout "
              "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
              "--micro-batch-size --global-batch-size --use-distributed-optimizer --overlap-grad-reduce "
              "--overlap-param-gather --tp-comm-overlap --bf16 --fp16 --grad-reduce-in-bf16 "
              "--recompute-granularity --recompute-method --recompute-num-layers --recompute-activations "
              "--recompute-modules --moe-layer-recompute "
              "--overlap-moe-expert-parallel-comm --delay-wgrad-compute"),
    # ---- the model: priced (sizes checked against the model, the rest compared in a note) -----------------
    **_fam(P, "--num-layers --hidden-size --num-attention-heads --seq-length --max-position-embeddings "
              "--ffn-hidden-size --num-query-groups --group-query-attention --kv-channels --num-experts "
              "--moe-router-topk --vocab-size --make-vocab-size-divisible-by --normalization --norm-epsilon --swiglu "
              "--position-embedding-type --rotary-base --use-rope-scaling --disable-bias-linear --add-qkv-bias "
              "--untie-embeddings-and-output-weights --attention-dropout --hidden-dropout --moe-ffn-hidden-size "
              "--moe-token-dispatcher-type --moe-grouped-gemm --moe-shared-expert-intermediate-size --moe-layer-freq "
              "--window-size --window-attn-skip-freq --rope-scaling-factor --moe-shared-expert-gate "
              "--moe-router-pre-softmax --qk-layernorm"),
    # ---- what changes the step in ways sapp does not price: refused ---------------------------------------
    "--num-distributed-optimizer-instances": (
        "refused", "a partial distributed optimizer (optimizer state sharded within each of several data-parallel "
                   "instances, then all-reduced across them)", ("1",)),
    "--main-grads-dtype": ("refused", "the precision-aware optimizer's bf16 main gradients", ("fp32",)),
    "--main-params-dtype": ("refused", "the precision-aware optimizer's fp16 master weights", ("fp32",)),
    "--exp-avg-dtype": ("refused", "Adam moments stored below fp32 (the precision-aware optimizer)", ("fp32",)),
    "--exp-avg-sq-dtype": ("refused", "Adam moments stored below fp32 (the precision-aware optimizer)", ("fp32",)),
    "--optimizer": ("refused", "an optimizer other than Adam (sapp prices Adam's two states)", ("adam",)),
    "--attention-backend": ("refused", "unfused or local attention (Megatron's default backend runs fused / flash "
                                       "kernels)",
                            ("auto", "flash", "fused")),
    "--transformer-impl": ("refused", "Megatron's local layers instead of Transformer Engine's fused ones",
                           ("transformer_engine",)),
    "--cuda-graph-impl": ("refused", "CUDA graphs", ("none",)),
    "--softmax-type": ("refused", "attention with learned sinks or an off-by-one softmax", ("vanilla",)),
    "--distributed-backend": ("refused", "a backend other than NCCL for the collectives", ("nccl",)),
    "--cpu-offloading-num-layers": ("refused", "activation offloading to the host", ("0",)),
    **{f: ("refused", what, ()) for f, what in (
        ("--fp4-format", "FP4 training"),
        ("--te-precision-config-file", "per-layer precision from a Transformer Engine file"),
        ("--mtp-num-layers", "multi-token prediction layers"),
        ("--hierarchical-context-parallel-sizes", "hierarchical (a2a+p2p) context parallelism"),
        ("--microbatch-group-size-per-virtual-pipeline-stage", "an interleaved schedule with other micro-batch groups"),
        ("--experimental-attention-variant", "an experimental attention variant"),
        ("--linear-attention-freq", "linear attention layers"),
        ("--encoder-num-layers", "an encoder stack"), ("--decoder-num-layers", "the layer count written as "
                                                                            "--decoder-num-layers: write --num-layers"),
        ("--encoder-seq-length", "the sequence length written as --encoder-seq-length: write --seq-length"),
        ("--padded-vocab-size", "a padded vocabulary given directly: write --vocab-size"),
        ("--moe-expert-capacity-factor", "capacity-limited expert routing"),
        ("--moe-latent-size", "a latent projection around the experts"),
        ("--heterogeneous-layers-config-path", "layers of different shapes"),
        ("--heterogeneous-layers-config-encoded-json", "layers of different shapes"),
        ("--spec", "a custom layer spec"), ("--yaml-cfg", "arguments read from a YAML file"),
        ("--symmetric-ar-type", "NCCL symmetric-memory all-reduce kernels"))},
    **{f: ("refused", what) for f, what in (
        ("--hybrid-context-parallel", "hybrid context parallelism over packed sequences"),
        ("--moe-extended-tp", "experts split over tensor parallelism (extended tp)"),
        ("--deterministic-mode", "deterministic kernels"), ("--batch-invariant-mode", "batch-invariant kernels"),
        ("--no-tp-comm-overlap-ag", "tensor-parallel all-gathers not overlapped under --tp-comm-overlap"),
        ("--disable-tp-comm-overlap-ag", "tensor-parallel all-gathers not overlapped under --tp-comm-overlap"),
        ("--no-tp-comm-overlap-rs", "tensor-parallel reduce-scatters not overlapped under --tp-comm-overlap"),
        ("--disable-tp-comm-overlap-rs", "tensor-parallel reduce-scatters not overlapped under --tp-comm-overlap"),
        ("--defer-embedding-wgrad-compute", "embedding weight gradients deferred into the pipeline flush"),
        ("--overlap-p2p-communication-warmup-flush", "pipeline sends overlapped during warmup and flush"),
        ("--no-overlap-p2p-communication", "interleaved pipeline sends not overlapped with compute"),
        ("--mtp-standalone", "multi-token prediction on its own stage"),
        ("--fp32-residual-connection", "an fp32 residual stream"),
        ("--qk-l2-norm", "query/key L2 normalization"), ("--qk-clip", "query/key weight clipping (QK-clip)"),
        ("--attention-output-gate", "a gated attention output"),
        ("--distribute-saved-activations", "recomputation checkpoints split over tensor parallelism"),
        ("--use-kitchen-attention", "Kitchen attention kernels"),
        ("--moe-shared-expert-overlap", "the shared expert overlapped with the token dispatch"),
        ("--moe-enable-routing-replay", "recorded and replayed routing"),
        ("--moe-enable-deepep", "DeepEP's fused token dispatcher"),
        ("--enable-cuda-graph", "CUDA graphs"), ("--external-cuda-graph", "CUDA graphs"),
        ("--is-hybrid-model", "hybrid Mamba layers"), ("--fine-grained-activation-offloading", "activation offloading"),
        ("--use-rotary-position-embeddings", "a deprecated way to state rope: write --position-embedding-type rope"),
        ("--quick-geglu", "a quick-GeGLU gated MLP (sapp states gated MLPs as --swiglu)"),
        ("--squared-relu", "a squared-ReLU MLP"), ("--use-legacy-models", "Megatron's legacy models"),
        ("--optimizer-cpu-offload", "optimizer offload"), ("--perform-rl-step", "reinforcement learning steps"),
        ("--fp8-param-gather", "FP8 parameter all-gathers"), ("--use-megatron-fsdp", "Megatron FSDP"),
        ("--use-torch-fsdp2", "torch FSDP2 inside Megatron"), ("--fake-process-group", "a fake process group"),
        ("--ddp-reduce-scatter-with-fp32-accumulation", "a gradient reduce-scatter accumulating in fp32"),
        ("--overlap-param-gather-with-optimizer-step", "the parameter all-gather overlapped with the optimizer step"),
        ("--use-tp-pp-dp-mapping", "ranks ordered tp-pp-dp (which groups share a node)"),
        ("--reset-attention-mask", "document-masked attention (an attention mask per sample)"),
        ("--use-checkpoint-args", "arguments read from the checkpoint instead of this file"),
        ("--use-mp-args-from-checkpoint-args", "parallel sizes read from the checkpoint instead of this file"),
        ("--sft", "supervised fine-tuning on packed sequences of varying length"))},
    **{f: ("rejected", why) for f, why in (
        ("--batch-size", "no longer valid, use --micro-batch-size"), ("--warmup", "no longer valid, use "
                                                                                 "--lr-warmup-fraction"),
        ("--model-parallel-size", "no longer valid, use --tensor-model-parallel-size"),
        ("--checkpoint-activations", "no longer valid, use --recompute-activations or --recompute-granularity"))},
    # ---- irrelevant to the priced step -----------------------------------------------------------------
    "--use-precision-aware-optimizer": (
        "irrelevant", "Transformer Engine's Adam: with fp32 main gradients, master weights and moments (the dtype "
                      "flags' defaults; other dtypes are refused) the same 12 bytes of state and update"),
    "--no-position-embedding": (
        "irrelevant", "deprecated: Megatron-Core takes positions from --position-embedding-type (priced); Megatron "
                      "rejects it with any type but rope, and so does sapp"),
    "--accumulate-allreduce-grads-in-fp32": P,    # fp32 gradients under --fp16 (megatron._fp32_grads)
    "--use-flash-attn": ("irrelevant", "flash attention, which Megatron-Core's default attention backend picks "
                                       "already"),
    "--use-mcore-models": ("irrelevant", "deprecated and ignored: Megatron-Core models are the default"),
    **_fam(("irrelevant", "deprecated and ignored by Megatron-Core"),
           "--no-async-tensor-model-parallel-allreduce --disable-async-tensor-model-parallel-allreduce "
           "--no-scatter-gather-tensors-in-pipeline"),
    **_fam(_FUSION, "--no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-swiglu-fusion --no-bias-dropout-fusion "
                    "--no-rope-fusion --disable-jit-fuser --no-persist-layer-norm --use-te-activation-func "
                    "--cross-entropy-loss-fusion --cross-entropy-fusion-impl --fp16-lm-cross-entropy "
                    "--attention-softmax-in-fp32 --apply-query-key-layer-scaling "
                    "--no-clone-scatter-output-in-embedding --disable-clone-scatter-output-in-embedding "
                    "--disable-bf16-reduced-precision-matmul --moe-permute-fusion --moe-router-fusion "
                    "--moe-use-legacy-grouped-gemm --moe-apply-probs-on-input"),
    "--no-gradient-accumulation-fusion": (
        "irrelevant", "weight gradients added to the main-gradient buffer by a separate kernel instead of inside the "
                      "GEMM: the same GEMMs and buffers, one element-wise add"),
    **_fam(_ACT, "--rotary-percent --rotary-seq-len-interpolation-factor --no-rope-freq "
                 "--rope-type --rotary-interleaved --openai-gelu --glu-linear-offset --activation-func-clamp-value "
                 "--apply-layernorm-1p --apply-residual-connection-post-layernorm --calculate-per-token-loss "
                 "--rotary-scaling-factor --mscale --mscale-all-dim"),
    **_fam(_ROUTE, "--moe-router-num-groups --moe-router-group-topk "
                   "--moe-router-topk-scaling-factor --moe-router-score-function --moe-router-dtype "
                   "--moe-router-enable-expert-bias --moe-router-bias-update-rate --moe-router-force-load-balancing "
                   "--moe-z-loss-coeff --moe-input-jitter-eps --moe-router-load-balancing-type --moe-aux-loss-coeff"),
    **_fam(_TPO, "--no-tp-comm-bulk-wgrad --disable-tp-comm-bulk-wgrad --no-tp-comm-bulk-dgrad "
                 "--disable-tp-comm-bulk-dgrad --tp-comm-overlap-rs-dgrad --no-tp-comm-split-ag "
                 "--disable-tp-comm-split-ag "
                 "--no-tp-comm-split-rs --disable-tp-comm-split-rs --tp-comm-bootstrap-backend --tp-comm-overlap-cfg"),
    **_fam(_BUCKET, "--ddp-num-buckets --ddp-bucket-size --ddp-pad-buckets-for-high-nccl-busbw "
                    "--ddp-average-in-collective --no-align-grad-reduce --no-align-param-gather --use-nccl-ub "
                    "--disable-symmetric-registration --nccl-communicator-config-path --create-all-gather-group "
                    "--high-priority-stream-groups --pipeline-model-parallel-comm-backend --use-ring-exchange-p2p"),
    **_fam(("irrelevant", "switch-offloaded (SHARP) reductions where the fabric has them: the same collectives"),
           "--use-sharp --sharp-enabled-group"),
    **_fam(("irrelevant", "launcher and process-group setup"),
           "--local-rank --lazy-mpu-init --disable-gloo-process-groups"),
    **_fam(("irrelevant", "gradient clipping and NaN / large-gradient checks: one norm over the gradients, not "
                          "modelled"), "--clip-grad --no-check-for-nan-in-loss-and-grad --check-for-large-grads"),
    **_fam(("irrelevant", "fp16 loss scaling: one scalar"),
           "--loss-scale --initial-loss-scale --min-loss-scale --loss-scale-window --hysteresis"),
    **_fam(_OPT_HP, "--weight-decay --apply-wd-to-qk-layernorm --adam-beta1 --adam-beta2 --adam-eps "
                    "--no-weight-decay-cond-type"),
    **_fam(_read_only("--optimizer sgd or muon"), "--sgd-momentum --muon-momentum --muon-no-split-qkv "
                                                  "--muon-use-nesterov --muon-scale-mode --muon-fp32-matmul-prec "
                                                  "--muon-num-ns-steps --muon-tp-mode --muon-extra-scale-factor"),
    **_fam(_read_only("--optimizer-cpu-offload"),
           "--optimizer-offload-fraction --use-torch-optimizer-for-cpu-offload --overlap-cpu-optimizer-d2h-h2d "
           "--no-pin-cpu-grads --no-pin-cpu-params"),
    **_fam(_read_only("Megatron FSDP / torch FSDP2"),
           "--data-parallel-sharding-strategy --outer-dp-sharding-strategy --fsdp-double-buffer "
           "--suggested-communication-unit-size --enable-full-sharding-in-hsdp --fsdp-manual-registration "
           "--no-gradient-reduce-div-fusion --torch-fsdp2-no-reshard-after-forward --no-strict-fsdp-dtensor-load "
           "--disable-strict-fsdp-dtensor-load"),
    # FP8 linears through Transformer Engine (sapp/engines/fp8.py megatron_read: the format, the delayed
    # recipe, and the switches that change which GEMMs run FP8, refused there beside --fp8-format)
    **_fam(P, "--fp8-format --fp8-recipe --no-fp8-wgrad --disable-fp8-wgrad --first-last-layers-bf16"),
    **_fam(("irrelevant", "the delayed recipe's scale arithmetic (margin, amax history and how it is reduced, a few "
                          "scalars a tensor; --fp8-interval is ignored by Transformer Engine >= 1.8): the same casts "
                          "and GEMMs"),
           "--fp8-margin --fp8-interval --fp8-amax-history-len --fp8-amax-compute-algo"),
    **_fam(_read_only("--fp8-recipe custom"), "--fp8-quantizer-factory"),
    **_fam(_read_only("--first-last-layers-bf16"), "--num-layers-at-start-in-bf16 --num-layers-at-end-in-bf16"),
    **_fam(_read_only("Megatron FSDP"), "--keep-fp8-transpose-cache"),
    **_fam(_read_only("--fp8-recipe mxfp8"), "--reuse-grad-buf-for-mxfp8-param-ag"),
    **_fam(_FP4, "--fp4-recipe --fp4-param-gather --fp4-quantizer-factory"),
    **_fam(("irrelevant", "pads each expert's tokens to a multiple of 16 / 32 for the FP8 grouped GEMMs (under 32 "
                          "tokens an expert): sapp prices balanced routing without padding"),
           "--moe-router-padding-for-quantization --moe-router-padding-for-fp8"),
    **_fam(_read_only("multi-token prediction (--mtp-num-layers)"), "--mtp-loss-scaling-factor"),
    **_fam(_read_only("an experimental attention variant or linear attention"),
           "--dsa-indexer-n-heads --dsa-indexer-head-dim --dsa-indexer-topk --dsa-indexer-loss-coeff "
           "--dsa-indexer-use-sparse-loss --linear-conv-kernel-dim --linear-key-head-dim --linear-value-head-dim "
           "--linear-num-key-heads --linear-num-value-heads"),
    # multi-latent attention (DeepSeek-V3 exports, sapp/engines/arch_mla.py): compared with the model on import
    **_fam(P, "--multi-latent-attention --q-lora-rank --kv-lora-rank --qk-head-dim --qk-pos-emb-head-dim --v-head-dim"),
    "--cache-mla-latents": _INFER,
    **_fam(_read_only("--qk-clip"), "--qk-clip-alpha --qk-clip-threshold"),
    **_fam(_read_only("--hybrid-context-parallel"), "--max-seqlen-per-dp-cp-rank"),
    **_fam(_read_only("--squared-relu"), "--use-fused-weighted-squared-relu"),
    **_fam(_read_only("Kitchen attention"), "--kitchen-attention-backend"),
    **_fam(_read_only("the flex dispatcher (DeepEP / HybridEP)"),
           "--moe-flex-dispatcher-backend --moe-deepep-num-sms --moe-hybridep-num-sms"),
    **_fam(_read_only("--moe-expert-capacity-factor"), "--moe-pad-expert-input-to-capacity --moe-token-drop-policy"),
    **_fam(_read_only("CUDA graphs"), "--cuda-graph-warmup-steps --cuda-graph-scope"),
    "--ep-overlap-early-attn-memory-release": ("irrelevant", "when the overlap frees the attention's saved tensors: "
                                               "the same compute and all-to-alls, a transient not modelled"),
    **_fam(_read_only("--defer-embedding-wgrad-compute"), "--wgrad-deferral-limit"),
    **_fam(_read_only("--fine-grained-activation-offloading"), "--offload-modules --min-offloaded-tensor-size"),
    **_fam(_read_only("hybrid Mamba models (--is-hybrid-model)"),
           "--mamba-state-dim --mamba-head-dim --mamba-num-groups --mamba-num-heads --disable-mamba-mem-eff-path "
           "--hybrid-attention-ratio --hybrid-mlp-ratio --hybrid-override-pattern"),
    **_fam(_read_only("relative or multimodal rope positions (noted as another model)"),
           "--relative-attention-num-buckets --relative-attention-max-distance --mrope-section"),
    **_fam(("irrelevant", "a switch other experimental flags check"), "--enable-experimental"),
    **_fam(_INIT, "--no-initialization --use-cpu-initialization --init-method-std --embedding-init-method-std "
                  "--init-model-with-meta-device --seed --te-rng-tracker --inference-rng-tracker "
                  "--data-parallel-random-init --init-method-xavier-uniform --moe-use-upcycling "
                  "--moe-upcycling-granularity"),
    **_fam(("irrelevant", "a batch that ramps up or shrinks over the run: sapp prices the steps at "
                          "--global-batch-size"), "--rampup-batch-size --decrease-batch-size-if-needed"),
    **_fam(("irrelevant", "memory freed or synchronised between steps: no change to a step's peak"),
           "--empty-unused-memory-level --train-sync-interval"),
    **_fam(_RUN, "--train-iters --train-samples --exit-interval --exit-duration-in-mins --exit-signal-handler "
                 "--exit-signal --exit-signal-handler-for-dataloader --manual-gc --manual-gc-interval "
                 "--no-manual-gc-eval --disable-manual-gc-eval --iterations-to-skip "
                 "--check-weight-hash-across-dp-replicas-interval --result-rejected-tracker-filename "
                 "--distributed-timeout-minutes --distributed-timeout-seconds-after-init --adlr-autoresume "
                 "--adlr-autoresume-interval --inprocess-restart --inprocess-max-iterations "
                 "--inprocess-monitor-thread-interval --inprocess-monitor-process-interval "
                 "--inprocess-progress-watchdog-interval --inprocess-heartbeat-interval --inprocess-soft-timeout "
                 "--inprocess-hard-timeout --inprocess-heartbeat-timeout --inprocess-barrier-timeout "
                 "--inprocess-completion-timeout --inprocess-last-call-wait --inprocess-termination-grace-time "
                 "--inprocess-granularity --inprocess-active-world-size --inprocess-empty-cuda-cache "
                 "--enable-ft-package --calc-ft-timeouts --ft-num-warmup-iters --error-injection-rate "
                 "--error-injection-type --rerun-mode --check-for-spiky-loss --test-mode --onnx-safe "
                 "--dump-param-to-param-group-map"),
    **_fam(("irrelevant", "evaluation between training steps"),
           "--eval-iters --eval-interval --skip-train --full-validation --multiple-validation-sets"),
    **_fam(_LR, "--lr-decay-style --lr-wsd-decay-style --lr-decay-iters --lr-decay-samples --lr-wsd-decay-iters "
                "--lr-wsd-decay-samples --lr-warmup-fraction --lr-warmup-iters --lr-warmup-samples --lr-warmup-init "
                "--override-opt_param-scheduler --override-opt-param-scheduler --use-checkpoint-opt_param-scheduler "
                "--use-checkpoint-opt-param-scheduler --start-weight-decay --end-weight-decay "
                "--weight-decay-incr-style --lr --min-lr --decoupled-lr --decoupled-min-lr"),
    **_fam(_CKPT, "--save --save-interval --persistent-save-interval --save-wgrads-interval --save-dgrads-interval "
                  "--save-retain-interval --load --load-main-params-from-ckpt --non-persistent-save-interval "
                  "--non-persistent-ckpt-type --non-persistent-global-ckpt-dir --non-persistent-local-ckpt-dir "
                  "--non-persistent-local-ckpt-algo --finetune --pretrained-checkpoint --ckpt-step "
                  "--no-use-tokenizer-model-from-checkpoint-args --disable-use-tokenizer-model-from-checkpoint-args "
                  "--exit-on-missing-checkpoint --ckpt-format --auto-detect-ckpt-format --ckpt-convert-format "
                  "--ckpt-convert-save --ckpt-convert-update-legacy-dist-opt-format --no-ckpt-fully-parallel-save "
                  "--disable-ckpt-fully-parallel-save --async-save --use-persistent-ckpt-worker "
                  "--ckpt-fully-parallel-load --ckpt-assume-constant-structure --dist-ckpt-strictness "
                  "--dist-ckpt-save-pre-mcore-014 --dist-ckpt-optim-fully-reshardable "
                  "--distrib-optim-fully-reshardable-mem-efficient --replication --replication-jump "
                  "--replication-factor --no-save-optim --no-save-rng --no-load-optim --no-load-rng --use-dist-ckpt "
                  "--dist-ckpt-format --ckpt-fully-parallel-save --disable-msc"),
    **_fam(_DATA, "--data-path --phase-transition-iterations --split --train-data-path --valid-data-path "
                  "--test-data-path --data-args-path --per-split-data-args-path --per-dataset-sequences-path "
                  "--dataloader-fast-cache-load --dataloader-defer-npy-index-mmap --data-cache-path "
                  "--no-mmap-bin-files --mock-data --num-workers --reset-position-ids --eod-mask-loss "
                  "--no-create-attention-mask-in-dataloader --num-dataset-builder-threads --object-storage-cache-path "
                  "--mid-level-dataset-surplus --allow-ambiguous-pad-tokens --fim-data --fim-rate --fim-spm-rate "
                  "--fim-split-sample --fim-fragment-rate --fim-no-prefix --fim-prefix-token --fim-middle-token "
                  "--fim-suffix-token --fim-pad-token --fim-eod-token --dataloader-type --sft-tokenizer-prompt-format"),
    **_fam(_TOK, "--vocab-file --merge-file --vocab-extra-ids --tokenizer-type --tokenizer-model --tokenizer-metadata "
                 "--tokenizer-special-tokens --legacy-tokenizer --tiktoken-pattern --tiktoken-num-special-tokens "
                 "--tiktoken-special-tokens --tokenizer-sentencepiece-legacy --tokenizer-hf-use-fast "
                 "--tokenizer-hf-include-special-tokens --trust-remote-code"),
    **_fam(_OTHER_MODEL, "--decoder-seq-length --sample-rate --mask-prob --short-seq-prob --bert-no-binary-head "
                         "--ict-head-size --biencoder-projection-dim --biencoder-shared-query-context-model --ict-load "
                         "--bert-load --titles-data-path --query-in-block-prob --use-one-sent-docs "
                         "--evidence-data-path "
                         "--retriever-report-topk-accuracies --retriever-score-scaling --block-data-path "
                         "--embedding-path --indexer-batch-size --indexer-log-interval --num-classes --img-h --img-w "
                         "--num-channels --patch-dim --classes-fraction --data-per-class-fraction --no-data-sharding "
                         "--head-lr-mult --vision-pretraining --vision-pretraining-type --vision-backbone-type "
                         "--swin-backbone-type --mask-type --mask-factor --iter-per-epoch --dino-local-img-size "
                         "--dino-local-crops-number --dino-head-hidden-size --dino-bottleneck-size "
                         "--dino-freeze-last-layer --dino-norm-last-layer --dino-warmup-teacher-temp "
                         "--dino-teacher-temp "
                         "--dino-warmup-teacher-temp-epochs"),
    **_fam(_INFER, "--flash-decode --inference-fuse-tp-communication --mlp-chunks-for-prefill "
                   "--moe-pad-experts-for-cuda-graph-inference --inference-batch-times-seqlen-threshold "
                   "--max-tokens-to-oom --output-bert-embeddings --bert-embedder-type --use-legacy-static-engine "
                   "--inference-max-requests --inference-max-seq-length --inference-max-batch-size "
                   "--inference-dynamic-batching --inference-dynamic-batching-buffer-size-gb "
                   "--inference-dynamic-batching-paused-buffer-size-gb --inference-dynamic-batching-block-size "
                   "--inference-dynamic-batching-max-requests --inference-dynamic-batching-max-tokens "
                   "--inference-dynamic-batching-num-cuda-graphs "
                   "--inference-dynamic-batching-track-paused-request-events --decode-only-cuda-graphs "
                   "--inference-dynamic-batching-unified-memory-level --nccl-all-reduce-for-prefill "
                   "--enable-chunked-prefill --disable-chunked-prefill "
                   "--inference-dynamic-batching-cuda-graph-max-tokens "
                   "--inference-dynamic-batching-cuda-graph-mixed-prefill-count --inference-logging-step-interval "
                   "--inference-wandb-logging --no-inference-wandb-logging --inference-coordinator-port"),
    **_fam(_LOG, "--log-interval --log-params-norm --log-throughput --log-progress --timing-log-level "
                 "--timing-log-option --tensorboard-dir --tensorboard-log-interval --tensorboard-queue-size "
                 "--log-timers-to-tensorboard --no-log-loss-scale-to-tensorboard "
                 "--disable-log-loss-scale-to-tensorboard --log-validation-ppl-to-tensorboard "
                 "--log-memory-to-tensorboard --log-memory-interval --log-device-memory-used --log-num-zeros-in-grad "
                 "--log-max-attention-logit --no-barrier-with-level-1-timing --log-world-size-to-tensorboard "
                 "--wandb-project --wandb-exp-name --wandb-save-dir --wandb-entity --logging-level --log-energy "
                 "--log-straggler --straggler-ctrlr-port --straggler-minmax-count --disable-straggler-on-startup "
                 "--run-workload-inspector-server --config-logger-dir --moe-per-layer-logging --no-one-logger "
                 "--one-logger-project --one-logger-run-name --one-logger-async --app-tag-run-name "
                 "--app-tag-run-version --profile --profile-step-start --profile-step-end --use-pytorch-profiler "
                 "--profile-ranks --record-memory-history --memory-snapshot-path"),
    **_fam(_RL, "--rl-prompts-per-eval --grpo-prompts-per-step --grpo-group-size --grpo-iterations "
                "--grpo-clamp-eps-lower --grpo-clamp-eps-upper --grpo-kl-beta --grpo-entropy-term-weight "
                "--grpo-filter-groups-with-same-reward --langrl-inference-server-type "
                "--langrl-inference-server-conversation-template --langrl-external-server --no-langrl-external-server "
                "--langrl-env-config --rl-default-temperature --rl-default-top-p --rl-default-top-k "
                "--rl-offload-optimizer-during-inference --rl-offload-kv-cache-during-training "
                "--no-rl-offload-kv-cache-during-training --rl-remove-kv-cache-during-training "
                "--no-rl-remove-kv-cache-during-training --rl-reset-cuda-graphs --no-rl-reset-cuda-graphs "
                "--rl-partial-rollouts --no-rl-partial-rollouts --rl-inference-logprobs-is-correction "
                "--no-rl-inference-logprobs-is-correction --rl-importance-sampling-truncation-coef "
                "--rl-use-sequence-packing --no-rl-use-sequence-packing --rl-sequence-packing-max-sequences-per-bin "
                "--rl-sequence-packing-algo --rl-training-cuda-graphs --no-rl-training-cuda-graphs "
                "--rl-inference-tensor-model-parallel-size --rl-inference-pipeline-model-parallel-size "
                "--rl-inference-expert-model-parallel-size --rl-inference-expert-tensor-model-parallel-size "
                "--rl-inference-model-unified-memory-level --rl-offload-inference-model-weights-when-idle "
                "--no-rl-offload-inference-model-weights-when-idle --refit-method --rl-verify-model-weights-swap "
                "--no-rl-verify-model-weights-swap --rl-parallel-generation-tasks --rl-skip-bos-token "
                "--no-rl-skip-bos-token"),
}

# flags that take several values (argparse nargs "+" / "*" / 3): the tokenizer gathers them
MULTI = set("--hierarchical-context-parallel-sizes --recompute-modules --offload-modules --mrope-section "
            "--moe-router-load-balancing-type --moe-aux-loss-coeff --profile-ranks --rampup-batch-size "
            "--iterations-to-skip --high-priority-stream-groups --cp-comm-type --data-path --train-data-path "
            "--valid-data-path --test-data-path --tokenizer-special-tokens --tiktoken-special-tokens "
            "--retriever-report-topk-accuracies --cuda-graph-scope --spec".split())


def _same(value, ok) -> bool:
    """Whether a file's value is one of `ok` (numbers compared as numbers: 1 and 1.0 alike)."""
    for want in ok:
        if str(value) == want:
            return True
        try:
            if float(value) == float(want):
                return True
        except (TypeError, ValueError):
            pass
    return False


def check(args: dict) -> None:
    """Refuses (one line) the first flag Megatron-LM does not have, or set to something sapp does not price."""
    for flag, value in args.items():
        kind = FIELDS.get(flag)
        if kind is None:
            raise EngineError(f"{flag}: Megatron-LM {VERSION}'s parser has no such argument and rejects the file; "
                              f"remove it")
        if kind == P or kind[0] == "irrelevant":
            continue
        if kind[0] == "rejected":
            raise EngineError(f"{flag}: Megatron-LM {VERSION} rejects it ({kind[1]})")
        if len(kind) == 2:
            raise EngineError(f"{flag}: sapp does not price {kind[1]}; remove it to price the rest")
        if value is True:
            raise EngineError(f"{flag} needs a value")
        if not _same(value, kind[2]):
            fix = f"use {kind[2][0]} or remove it" if kind[2] else "remove it to price the rest"
            raise EngineError(f"{flag} {value}: sapp does not price {kind[1]}; {fix}")
    if args.get("--no-position-embedding") and args.get("--position-embedding-type") != "rope":
        raise EngineError(f"--no-position-embedding: Megatron-LM {VERSION} rejects it without "
                          f"--position-embedding-type rope (it is deprecated; use --position-embedding-type)")


_REPEAT = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))   # Megatron's own two unrolling rules
_MAX_LAYOUT = 1_000_000                                                     # characters once unrolled


def layout_counts(args: dict, pp: int, L: int) -> list:
    """Decoder layers of each virtual stage of --pipeline-model-parallel-layout, in Megatron's order
    (virtual stage c * pp + i is chunk c of pipeline rank i), checked as Megatron checks it: "E" the
    embedding first, "L" the loss last, "t" the L decoder layers, "|" between stages, "(...)*n" and
    "x*n" repeats, commas cosmetic.  Unrolled by pattern, never evaluated; refused in one line."""
    text = args["--pipeline-model-parallel-layout"]
    flag = "--pipeline-model-parallel-layout"
    clash = [f for f in ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                         "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                         "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
             if f in args]
    if clash:
        raise EngineError(f"{flag} with {clash[0]}: Megatron-LM rejects the two together; keep the layout alone")
    if not isinstance(text, str) or not text:
        raise EngineError(f"{flag} needs a value (e.g. \"Et|(tt|)*3,tL\")")
    s = text.replace(",", "")

    def unroll(m):
        n = int(m.group(2)[:8])
        if len(m.group(2)) > 7 or len(m.group(1)) * n > _MAX_LAYOUT:
            raise EngineError(f"{flag}: a repeat of {m.group(2)[:12]} is far more layers than any model has")
        return m.group(1) * n
    for pat in _REPEAT:
        s = pat.sub(unroll, s)
        if len(s) > _MAX_LAYOUT:
            raise EngineError(f"{flag} unrolls to more than {_MAX_LAYOUT} layers")
    bad = sorted(set(s) - set("ELtm|"))
    if bad:
        raise EngineError(f"{flag}: {bad[0]!r} is not a layer Megatron knows (E embedding, t decoder layer, "
                          f"m multi-token prediction, L loss, | between stages)")
    if "m" in s:
        raise EngineError(f"{flag}: sapp does not price multi-token prediction layers (m); remove them")
    flat = s.replace("|", "")
    if not flat or flat[0] != "E" or flat[-1] != "L" or flat.count("E") != 1 or flat.count("L") != 1:
        raise EngineError(f"{flag}: Megatron needs the embedding E once, first, and the loss L once, last")
    stages = [st.count("t") for st in s.split("|")]
    if sum(stages) != L:
        raise EngineError(f"{flag} places {sum(stages)} decoder layers but the model has {L}")
    if len(stages) % pp:
        raise EngineError(f"{flag} has {len(stages)} stages, not a multiple of --pipeline-model-parallel-size {pp}")
    if pp == 1 and len(stages) > 1:
        raise EngineError(f"{flag} has {len(stages)} virtual stages on one pipeline rank: sapp prices interleaving "
                          f"with --pipeline-model-parallel-size > 1")
    return stages
