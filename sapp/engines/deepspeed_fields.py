"""Every key of DeepSpeed 0.19.8's configuration surface, classified for `sapp import --from deepspeed`.

A key path ("zero_optimization.stage") is one of:
  ("priced", how)           read by deepspeed.parse and priced as it says;
  ("refused", ok, change)   refused in one line when its value is not one of `ok` (DeepSpeed's default
                            among them; `()`: refused whenever present, as for the keys DeepSpeed 0.19.8
                            itself rejects as removed): the step changes in a way sapp does not price;
  ("irrelevant", why)       no change to the step sapp prices, with the reason.
An entry covers the keys below it (a section refused or irrelevant as a whole).

CLOSED lists the sections DeepSpeed validates with pydantic models that forbid extra keys: a key
there that the table does not know is one DeepSpeed rejects, so sapp refuses it too; an unknown
top-level or plain-section key is one DeepSpeed never reads, ignored with a note.  DeepSpeed's
pydantic configs drop the value "auto" (the Hugging Face Trainer fills those in before DeepSpeed
sees them), so inside CLOSED sections "auto" reads as DeepSpeed's default, except the precision
switches, which deepspeed.parse refuses ("auto" there is the Trainer's --bf16/--fp16).

tests/test_engines_fields.py walks the installed DeepSpeed's own config code (tests/deepspeed_surface.py)
and fails on a key missing here, a key here that DeepSpeed does not read, or a refused field whose
DeepSpeed default the table would refuse."""
from __future__ import annotations

from .mapping import EngineError

VERSION = "0.19.8"
_ANY = ()    # refused whenever present


def _both(section, pairs, kind):
    """A pydantic field DeepSpeed accepts by its name and its alias (populate_by_name)."""
    return {f"{section}.{k}": kind for pair in pairs for k in pair}


_LOG = ("irrelevant", "logging, monitoring and profiling output: no work inside the priced step")
_CKPT = ("irrelevant", "checkpoint saving and loading between steps")
_OPT_HP = ("irrelevant", "optimizer hyperparameters: the same update work per step")
_NVME = ("irrelevant", "read only with NVMe offload, which is refused")
_POFF = ("irrelevant", "read only with parameter offload, which is refused")
# sapp's host placement moves the optimizer only (placement.NAMES): parameters on the host have no price there
_NO_POFF = ("set it to \"none\": sapp does not price parameters held on the host and copied to the device "
            "for every layer's gather in forward and backward (its host placement moves the optimizer only)")
_TP = ("irrelevant", "read only with AutoTP (tensor_parallel.autotp_size > 1), which is refused")
_EP = ("irrelevant", "read only with AutoEP (expert_parallel.enabled), which is refused")
_Z3 = ("irrelevant", "ZeRO-3 gather/prefetch/persistence tuning: the same per-layer all-gathers sapp prices; "
                     "the transient buckets are not modelled")
_BUCKET = ("irrelevant", "communication bucket sizes: the same bytes reduced or gathered per step; the transient "
                         "buckets are not modelled")
_ZPP = "ZeRO++ (quantized collectives / hierarchical partitioning) is not priced by sapp; remove it"
_REMOVED = "DeepSpeed {v} rejects it (removed from DeepSpeed); remove it"
_BF16 = {
    "enabled": ("priced", "bf16-mixed precision (true); \"auto\" is refused: the HF Trainer fills it from --bf16"),
    "bf16_master_weights_and_grads": (
        "priced", "bf16 master weights: 10 optimizer bytes per parameter instead of 12 (ZeRO 1-3 only)"),
    "bf16_optimizer_states": ("priced", "bf16 master weights and Adam moments: 6 optimizer bytes per parameter"),
    "immediate_grad_update": ("irrelevant", "when the bf16 optimizer folds each gradient into its accumulation "
                                            "buffer (backward hook or step): the same buffers are held"),
    "check_grad_overflow": ("irrelevant", "an overflow check over the gradients before the step, not modelled"),
}

FIELDS = {
    # ---- batch and step: priced -----------------------------------------------------------------
    "train_batch_size": ("priced", "the global batch"),
    "train_micro_batch_size_per_gpu": ("priced", "the micro-batch size"),
    "gradient_accumulation_steps": ("priced", "the micro-batches per step"),
    "managed_gradient_accumulation": (
        "refused", (True,), "set it to true: unmanaged accumulation moves the gradient reduction to step(), "
                            "which sapp does not price"),
    "optimizer.type": ("priced", "Adam / AdamW (sapp prices Adam's two states); another optimizer is refused"),
    "optimizer.params": _OPT_HP,
    "optimizer.legacy_fusion": ("irrelevant", "a legacy fp16 optimizer switch: the same update"),
    "scheduler": ("irrelevant", "the learning-rate schedule: no work inside a step"),
    "zero_allow_untested_optimizer": ("irrelevant", "permission to run a client optimizer under ZeRO"),
    "zero_force_ds_cpu_optimizer": ("irrelevant", "which CPU Adam implementation runs the offloaded step"),
    "gradient_clipping": ("irrelevant", "gradient clipping: one norm over the gradients, not modelled"),
    "prescale_gradients": ("irrelevant", "where gradients are divided by the world size: an element-wise scale"),
    "gradient_predivide_factor": ("irrelevant", "where gradients are divided by the world size"),
    "gradient_allreduce_op": ("irrelevant", "sum or mean: the same collective"),
    "disable_allgather": ("irrelevant", "read by DeepSpeed 0.19.8's config but used nowhere"),
    "communication_data_type": (
        "priced", "the gradient reduction in the training precision's own width; another width is refused"),
    "seq_parallel_communication_data_type": (
        "irrelevant", "read only with Ulysses sequence parallelism, which is refused"),
    "sequence_parallel_size": (
        "refused", (1,), "set it to 1: DeepSpeed-Ulysses sequence parallelism is not priced by sapp's DeepSpeed "
                         "import (price a sequence split as context parallelism from a Megatron or torchtitan config)"),
    "use_data_before_expert_parallelism": (
        "irrelevant", "the rank order of DeepSpeed-MoE groups; a DeepSpeed JSON states no expert parallelism"),
    "vocabulary_size": ("irrelevant", "read only for an alignment warning"),
    "dataloader_drop_last": ("irrelevant", "data loading"),
    "disable_python_gc": ("irrelevant", "Python garbage collection between steps"),
    "pipeline": (
        "refused", ({},), "remove the pipeline section: DeepSpeed's pipeline engine is not priced by sapp's "
                          "DeepSpeed import (price pipelines from a Megatron or torchtitan config)"),
    "allgather_size": ("irrelevant", "the bucket size of the old `zero_optimization: true` form"),
    # ---- precision -----------------------------------------------------------------------------
    **{f"{s}.{k}": v for s in ("bf16", "bfloat16") for k, v in _BF16.items()},
    "fp16.enabled": ("priced", "fp16-mixed precision (true); \"auto\" is refused: the HF Trainer fills it from --fp16"),
    "fp16.fp16_master_weights_and_grads": (
        "refused", (False,), "set it to false: fp16 master weights (DeepSpeedCPUAdam only) are not priced by sapp"),
    "fp16.auto_cast": ("irrelevant", "casting the inputs to fp16 at the module's entry: an element-wise cast"),
    **{f"fp16.{k}": ("irrelevant", "loss scaling: a scale of the loss and an unscale pass, skipped steps aside")
       for k in ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                 "min_loss_scale")},
    "torch_autocast.enabled": (
        "refused", (False,), "set it to false: torch.autocast over fp32 weights (no bf16/fp16 model copy) is not "
                             "priced by sapp's DeepSpeed import; use bf16.enabled"),
    "torch_autocast.dtype": ("irrelevant", "read only with torch_autocast on, which is refused"),
    "torch_autocast.lower_precision_safe_modules": ("irrelevant", "read only with torch_autocast on, which is refused"),
    "data_types.grad_accum_dtype": (
        "refused", (None,), "remove it: a gradient accumulation dtype other than the training precision's is not "
                            "priced by sapp"),
    "data_types.param_dtype": ("refused", (None,), "remove it: a parameter dtype apart from bf16/fp16.enabled is "
                                                   "not priced by sapp"),
    "data_types.buffer_dtype": ("irrelevant", "the dtype of module buffers (no gradients, no optimizer state)"),
    "data_types.keep_in_fp32_modules": ("irrelevant", "module buffers kept in fp32 (no gradients, no optimizer state)"),
    # ---- activation checkpointing (the script's deepspeed.checkpointing calls) --------------------
    "activation_checkpointing": ("priced", "present: full recomputation of every block (noted)"),
    "activation_checkpointing.partition_activations": (
        "irrelevant", "splits checkpoints over model-parallel ranks; a DeepSpeed JSON plan has none"),
    "activation_checkpointing.cpu_checkpointing": (
        "refused", (False,), "set it to false: checkpoints offloaded to CPU are not priced by sapp"),
    "activation_checkpointing.contiguous_memory_optimization": (
        "irrelevant", "checkpoints copied into one buffer: the same bytes kept"),
    "activation_checkpointing.number_checkpoints": ("irrelevant", "the size of that contiguous buffer"),
    "activation_checkpointing.synchronize_checkpoint_boundary": ("irrelevant", "a device synchronisation for debugging"),
    "activation_checkpointing.profile": _LOG,
    # ---- ZeRO ------------------------------------------------------------------------------------
    "zero_optimization.stage": ("priced", "the ZeRO stage"),
    "zero_optimization.offload_optimizer.device": (
        "priced", "\"cpu\": the optimizer on the host (ZeRO 1-3: each rank's 1/dp shard); \"nvme\" is refused"),
    "zero_optimization.offload_optimizer.pin_memory": (
        "refused", (True,), "set it to true: sapp prices offload over pinned host memory"),
    "zero_optimization.offload_optimizer.ratio": (
        "refused", (1, 1.0), "set it to 1.0: partial optimizer offload is not priced by sapp"),
    "zero_optimization.offload_optimizer.super_offload": (
        "refused", (False,), "set it to false: SuperOffload is not priced by sapp"),
    "zero_optimization.offload_optimizer.fast_init": ("irrelevant", "optimizer initialisation before training"),
    "zero_optimization.offload_optimizer.cpuadam_cores_perc": (
        "irrelevant", "CPU cores given to the host Adam; sapp prices it at the calibrated host rate"),
    **{f"zero_optimization.offload_optimizer.{k}": _NVME
       for k in ("nvme_path", "buffer_count", "pipeline_read", "pipeline_write")},
    "zero_optimization.offload_param.device": (
        "refused", ("none", None), _NO_POFF),
    **{f"zero_optimization.offload_param.{k}": _POFF
       for k in ("nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory")},
    "zero_optimization.cpu_offload": ("priced", "true: the optimizer on the host (the old offload_optimizer cpu)"),
    "zero_optimization.cpu_offload_param": (
        "refused", (False, None), "remove it: " + _NO_POFF[len("set it to \"none\": "):]),
    "zero_optimization.cpu_offload_use_pin_memory": ("irrelevant", "deprecated: DeepSpeed 0.19.8 ignores it"),
    "zero_optimization.zenflow": (
        "refused", (None,), "remove the zenflow section: ZenFlow's stall-free offloaded updates are not priced by sapp"),
    "zero_optimization.zero_quantized_weights": ("refused", (False,), _ZPP),
    "zero_optimization.zero_quantized_gradients": ("refused", (False,), _ZPP),
    "zero_optimization.zero_quantized_nontrainable_weights": ("refused", (False,), _ZPP),
    "zero_optimization.zero_hpz_partition_size": ("refused", (0, 1), _ZPP),
    **{f"zero_optimization.{k}": ("refused", _ANY, _REMOVED.format(v=VERSION))
       for k in ("mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param")},
    "zero_optimization.overlap_comm": (
        "irrelevant", "overlap of ZeRO's gradient reduction with backward; sapp's eager runtime prices the "
                      "reduction unhidden (grad_sync_overlap 0) either way"),
    "zero_optimization.reduce_scatter": ("irrelevant", "reduce-scatter or reduce of the same gradient bytes"),
    "zero_optimization.contiguous_gradients": ("irrelevant", "gradients copied into one buffer as produced"),
    "zero_optimization.reduce_bucket_size": _BUCKET,
    "zero_optimization.allgather_bucket_size": _BUCKET,
    "zero_optimization.allgather_partitions": ("irrelevant", "all-gather or broadcasts of the same updated bytes"),
    "zero_optimization.use_multi_rank_bucket_allreduce": ("irrelevant", "how the same reduction is batched"),
    "zero_optimization.round_robin_gradients": ("irrelevant", "the order of offloaded gradient copies"),
    "zero_optimization.compute_grad_norm": ("irrelevant", "the gradient norm: one pass over the gradients"),
    "zero_optimization.sub_group_size": ("irrelevant", "the tile size of the optimizer step over the partition"),
    "zero_optimization.parameter_alignment": ("irrelevant", "16-byte padding between parameters"),
    "zero_optimization.memory_efficient_linear": ("irrelevant", "ZeRO-3's linear that frees gathered weights"),
    "zero_optimization.load_from_fp32_weights": _CKPT,
    "zero_optimization.elastic_checkpoint": _CKPT,
    "zero_optimization.pipeline_loading_checkpoint": _CKPT,
    "zero_optimization.save_muon_momentum_buffer_in_memory": ("irrelevant", "read only with Muon, which is refused"),
    "zero_optimization.ignore_unused_parameters": ("irrelevant", "a check for parameters without gradients"),
    "zero_optimization.legacy_stage1": ("irrelevant", "the older implementation of the same ZeRO-1"),
    "zero_optimization.override_module_apply": ("irrelevant", "ZeRO-3's wrapper of nn.Module.apply at setup"),
    "zero_optimization.log_trace_cache_warnings": _LOG,
    "zero_optimization.enable_sanity_checks": ("irrelevant", "debug checks"),
    **{f"zero_optimization.leaf_module.{k}": _Z3 for k in ("classes", "names", "name_suffixes")},
    **_both("zero_optimization", [
        ("prefetch_bucket_size", "stage3_prefetch_bucket_size"),
        ("param_persistence_threshold", "stage3_param_persistence_threshold"),
        ("model_persistence_threshold", "stage3_model_persistence_threshold"),
        ("max_live_parameters", "stage3_max_live_parameters"),
        ("max_reuse_distance", "stage3_max_reuse_distance"),
        ("module_granularity_threshold", "stage3_module_granularity_threshold"),
        ("use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params"),
        ("allgather_sequential", "stage3_allgather_sequential")], _Z3),
    **_both("zero_optimization", [("gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
                                   "stage3_gather_fp16_weights_on_model_save")], _CKPT),
    # ---- parallelism DeepSpeed sets up beside the data-parallel step ------------------------------
    "tensor_parallel.autotp_size": (
        "refused", (0, 1), "set it to 0: AutoTP shards after the model's own tp plan (layer patterns, LM head), "
                           "which sapp's DeepSpeed import does not price (price tensor parallelism from a Megatron "
                           "or torchtitan config)"),
    **{f"tensor_parallel.{k}": _TP for k in (
        "dtype", "tp_overlap_comm", "vocab_parallel_lm_head", "vocab_parallel_ce_backend", "injection_policy_tuple",
        "partition_config", "preset_model", "keep_module_on_host", "kernel_inject", "replace_with_kernel_inject",
        *(f"{t}.{k}" for t in ("tp", "tensor_parallel") for k in ("tp_size", "tp_grain_size", "mpu", "tp_group")))},
    "expert_parallel.enabled": (
        "refused", (False,), "set it to false: AutoEP expert parallelism is not priced by sapp's DeepSpeed import"),
    "expert_parallel.autoep_size": ("refused", (1,), "set it to 1: AutoEP expert parallelism is not priced by "
                                                     "sapp's DeepSpeed import"),
    "expert_parallel.expert_tensor_parallel_size": ("refused", (1,), "set it to 1: expert tensor parallelism is "
                                                                     "not priced by sapp's DeepSpeed import"),
    "expert_parallel": _EP,
    "hybrid_engine.enabled": ("refused", (False,), "set it to false: the RLHF hybrid engine (generation inside "
                                                   "training) is not priced by sapp"),
    **{f"hybrid_engine.{k}": ("irrelevant", "read only with the hybrid engine on, which is refused") for k in (
        "max_out_tokens", "inference_tp_size", "release_inference_cache", "pin_parameters", "tp_gather_partition_size",
        "enable_cuda_graph")},
    "compile.deepcompile": ("refused", (False,), "set it to false: DeepCompile's compiled ZeRO schedule is not "
                                                 "priced by sapp (eager DeepSpeed is)"),
    **{f"compile.{k}": ("irrelevant", "options of DeepCompile (refused) and of engine.compile(), which the "
                                      "training script calls, not the JSON") for k in (
        "autoep_non_moe", "free_activation", "free_activation_threshold", "offload_activation",
        "offload_activation_pin_memory", "offload_opt_states", "double_buffer", "symmetric_memory", "debug_log",
        "offload_parameters", "sync_before_reduce", "sync_after_reduce", "sync_before_allgather",
        "sync_after_allgather", "keep_int_input_tensors", "keep_all_input_tensors", "passes")},
    "weight_quantization.quantized_initialization": (
        "refused", ({},), "remove it: weights stored quantized under ZeRO-3 are not priced by sapp"),
    "weight_quantization.post_init_quant": ("refused", ({},), "remove it: quantized weights are not priced by sapp"),
    **{f"weight_quantization.{k}": ("irrelevant", "the quantization format, read only with quantized weights "
                                                  "(refused)") for k in ("enabled", "num_bits", "q_groups", "q_type")},
    "data_efficiency.enabled": (
        "refused", (False,), "set it to false: curriculum / dynamic batching / random-LTD change the work per step, "
                             "which sapp does not price"),
    "data_efficiency": ("irrelevant", "read only with data_efficiency.enabled, which is refused"),
    # ---- outside the step --------------------------------------------------------------------------
    **{k: _LOG for k in ("steps_per_print", "wall_clock_breakdown", "memory_breakdown", "dump_state", "log_level",
                         "flops_profiler", "timers.throughput.enabled", "timers.throughput.synchronized")},
    **{f"{s}.{k}": _LOG for s, keys in (
        ("tensorboard", ("enabled", "output_path", "job_name")), ("csv_monitor", ("enabled", "output_path", "job_name")),
        ("wandb", ("enabled", "group", "team", "project")),
        ("comet", ("enabled", "samples_log_interval", "project", "workspace", "api_key", "experiment_name",
                   "experiment_key", "online", "mode")),
        ("comms_logger", ("enabled", "verbose", "prof_all", "debug", "prof_ops"))) for k in keys},
    "autotuning": ("irrelevant", "DeepSpeed's autotuner, run before training"),
    "checkpoint": _CKPT,
    "datastates_ckpt": _CKPT,
    "aio": ("irrelevant", "asynchronous I/O for NVMe offload (refused) and checkpoints"),
    **{k: ("refused", _ANY, _REMOVED.format(v=VERSION)) for k in (
        "nebula", "compression_training", "amp", "quantize_training", "sparse_gradients", "eigenvalue",
        "sparse_attention", "elasticity", "graph_harvesting", "curriculum_learning", "progressive_layer_drop")},
}

# the sections DeepSpeed validates with pydantic models (extra keys forbidden)
CLOSED = {"bf16", "bfloat16", "fp16", "zero_optimization", "zero_optimization.offload_optimizer",
          "zero_optimization.offload_param", "zero_optimization.zenflow", "zero_optimization.leaf_module",
          "tensor_parallel", "tensor_parallel.tp", "tensor_parallel.tensor_parallel", "hybrid_engine", "compile",
          "weight_quantization", "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger",
          "timers.throughput"}


def lookup(path: str):
    """The entry classifying `path`: its own, or a section's above it; None if DeepSpeed has no such key."""
    parts = path.split(".")
    kind = FIELDS.get(path)
    for n in range(len(parts) - 1, 0, -1):
        if kind is not None:
            break
        kind = FIELDS.get(".".join(parts[:n]))
        # a priced section (activation_checkpointing) names its keys; another there is one DeepSpeed never reads
        kind = None if kind is not None and kind[0] == "priced" else kind
    return kind


def _known_section(path: str) -> bool:
    return any(k.startswith(path + ".") for k in FIELDS)


def check(cfg: dict, where: str = "") -> list:
    """Refuses (one line) the first key set to something sapp does not price or DeepSpeed rejects;
    returns notes for keys DeepSpeed does not read."""
    notes = []
    section = where.rstrip(".")
    for key, value in cfg.items():
        path = f"{where}{key}"
        if section in CLOSED and value == "auto":
            continue        # DeepSpeed's pydantic configs drop "auto": its default
        kind = FIELDS.get(path)
        if kind is not None and kind[0] == "refused" and not _ok(value, kind[1]):
            raise EngineError(f"{path} = {_short(value)}: {kind[2]}")
        if _known_section(path):
            if isinstance(value, dict):
                notes += check(value, path + ".")
                continue
            if value is None and path in CLOSED:
                continue        # an optional section left at DeepSpeed's default
            if kind is None:
                raise EngineError(f"{path} = {_short(value)}: DeepSpeed reads a JSON object here; sapp cannot use "
                                  f"this value")
        if kind is None and section not in CLOSED:
            kind = lookup(path)         # a plain section classified as a whole
        if kind is None:
            if section in CLOSED:
                raise EngineError(f"{path}: DeepSpeed {VERSION} rejects it (no such field in its {section} "
                                  f"config); remove it")
            notes.append(f"{path} is not read by DeepSpeed {VERSION}: ignored")
    return notes


def _ok(value, allowed) -> bool:
    # true is not 1 here, nor 0 false: `autotp_size: true` is no setting DeepSpeed means
    return any(value is ok or (value == ok and not isinstance(value, bool) and not isinstance(ok, bool))
               for ok in allowed)


def _short(value) -> str:
    import json
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 40 else text[:37] + "..."
