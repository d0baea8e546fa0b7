"""Every field of torchtitan 0.2.2's JobConfig, classified for `sapp import`: priced (read by
torchtitan.parse), refused in one line when set to anything but torchtitan's default (it changes the
step in a way sapp does not price), or irrelevant to the priced step, with the reason.
tests/test_engines_fields.py walks torchtitan's own dataclasses and fails on a field missing here."""
from __future__ import annotations

from .mapping import EngineError

P = "priced"
# (section, key): "priced" | ("refused", torchtitan's default, what it runs) | ("irrelevant", why)
_RUN = ("irrelevant", "run bookkeeping (paths, logging, output): no work inside a step")
FIELDS = {
    **{("job", k): _RUN for k in ("config_file", "dump_folder", "description", "print_config", "save_config_file",
                                  "custom_config_module")},
    **{("profiling", k): ("irrelevant", "profiler and memory-snapshot output on the profiled steps only")
       for k in ("enable_profiling", "save_traces_folder", "profile_freq", "profiler_active", "profiler_warmup",
                 "enable_memory_snapshot", "save_memory_snapshot_folder")},
    **{("metrics", k): _RUN for k in ("log_freq", "enable_tensorboard", "disable_color_printing", "save_tb_folder",
                                      "save_for_all_ranks", "enable_wandb")},
    ("model", "name"): P, ("model", "flavor"): P,
    ("model", "hf_assets_path"): ("irrelevant", "tokenizer and weight files"),
    ("model", "tokenizer_path"): ("irrelevant", "tokenizer files"),
    ("model", "converters"): P,        # read by engines/fp8.py torchtitan_read: tensorwise float8 only
    ("model", "print_after_conversion"): _RUN,
    ("optimizer", "name"): ("refused", "AdamW", "an optimizer other than AdamW (sapp prices Adam's two states)"),
    **{("optimizer", k): ("irrelevant", "optimizer hyperparameters: the same update work per step")
       for k in ("lr", "beta1", "beta2", "eps", "weight_decay")},
    ("optimizer", "implementation"): ("irrelevant", "the same Adam update, one kernel or per-tensor loops"),
    ("optimizer", "early_step_in_backward"): ("refused", False, "the optimizer step inside backward"),
    **{("lr_scheduler", k): ("irrelevant", "the learning-rate schedule: no work inside a step")
       for k in ("warmup_steps", "total_steps", "decay_ratio", "decay_type", "min_lr_factor")},
    ("training", "dataset"): ("irrelevant", "the data source"),
    ("training", "dataset_path"): ("irrelevant", "the data source"),
    ("training", "local_batch_size"): P, ("training", "global_batch_size"): P, ("training", "seq_len"): P,
    ("training", "max_norm"): ("irrelevant", "gradient clipping: one norm over the gradients, not modelled"),
    ("training", "steps"): ("irrelevant", "the run's length"),
    ("training", "enable_cpu_offload"): ("refused", False, "parameter and optimizer CPU offload"),
    ("training", "dtype"): P,          # "bfloat16": pure bf16 training, the "adam-bf16" optimizer's states
    ("training", "mixed_precision_param"): P, ("training", "mixed_precision_reduce"): P,  # (0.2.2: "float32" only)
    ("training", "gc_freq"): ("irrelevant", "Python garbage collection between steps"),
    ("training", "gc_debug"): ("irrelevant", "Python garbage collection between steps"),
    ("training", "dataloader"): ("irrelevant", "data loading (overlapped with the step)"),
    **{("parallelism", k): P for k in (
        "data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
        "tensor_parallel_degree", "enable_async_tensor_parallel", "pipeline_parallel_degree",
        "module_fqns_per_model_part", "pipeline_parallel_first_stage_less_layers",
        "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
        "pipeline_parallel_microbatch_size", "context_parallel_degree", "expert_parallel_degree")},
    ("parallelism", "disable_loss_parallel"): ("refused", False, "the loss on gathered logits"),
    ("parallelism", "pipeline_parallel_schedule_csv"): ("refused", "", "a pipeline schedule read from a CSV file"),
    ("parallelism", "pipeline_parallel_expert_parallel_overlap"): (
        "irrelevant", "read only by the DualPipeV schedule, which sapp refuses"),
    ("parallelism", "context_parallel_load_balancer"): (
        "refused", "headtail", "context parallelism without head-tail load balancing of causal attention"),
    ("parallelism", "context_parallel_rotate_method"): (
        "refused", "allgather", "context parallelism rotating keys/values other than by all-gather"),
    ("parallelism", "expert_tensor_parallel_degree"): ("refused", 1, "experts split over tensor parallelism"),
    ("parallelism", "expert_parallel_comm_backend"): ("refused", "standard", "another expert all-to-all backend"),
    **{("checkpoint", k): ("irrelevant", "checkpoint loading and saving between steps") for k in (
        "enable", "enable_ft_dataloader_checkpoints", "folder", "interval", "initial_load_path",
        "initial_load_model_only", "initial_load_in_hf", "initial_load_in_hf_quantized", "last_save_model_only",
        "last_save_in_hf", "export_dtype", "async_mode", "keep_latest_k", "load_step", "exclude_from_loading",
        "enable_first_step_checkpoint", "create_seed_checkpoint", "load_only")},
    ("activation_checkpoint", "mode"): P, ("activation_checkpoint", "selective_ac_option"): P,
    ("activation_checkpoint", "per_op_sac_force_recompute_mm_shapes_by_fqns"): (
        "irrelevant", "linear layers whose GEMMs op-level checkpointing recomputes (default: MoE router gates, "
                      "a few columns wide): not priced"),
    ("activation_checkpoint", "early_stop"): ("refused", False, "recomputation that stops early"),
    ("activation_checkpoint", "memory_budget"): ("irrelevant", "read only by the memory_budget mode, which is refused"),
    ("activation_checkpoint", "visualize_memory_budget_pareto"): (
        "irrelevant", "read only by the memory_budget mode, which is refused"),
    ("activation_checkpoint", "preserve_rng_state"): ("irrelevant", "RNG bookkeeping for recomputed dropout"),
    ("activation_checkpoint", "determinism_check"): ("irrelevant", "a debug check of recomputation"),
    ("activation_checkpoint", "debug"): ("irrelevant", "debug output"),
    ("compile", "enable"): P, ("compile", "components"): P,    # "model": the "+compile" profile
    ("compile", "backend"): ("irrelevant", "read only with compile on, priced as inductor compiles"),
    # (read only by their model converters: a published job file carries [quantize.linear.float8] with
    # `converters` commented out and trains in bf16; with the float8 converter on, fp8.torchtitan_read
    # prices its tensorwise config and refuses the rest in one line)
    ("quantize", "linear"): P,
    ("quantize", "grouped_mm"): ("irrelevant", "read only by the grouped-GEMM converters, which are refused"),
    **{("comm", k): ("irrelevant", "collective timeouts and traces") for k in (
        "init_timeout_seconds", "train_timeout_seconds", "trace_buf_size", "save_traces_folder",
        "save_traces_file_prefix")},
    ("comm", "mode"): ("refused", "default", "a fake or local communication backend (a dry run)"),
    ("memory_estimation", "enable"): ("irrelevant", "a memory estimate before training"),
    ("memory_estimation", "disable_fake_mode"): ("irrelevant", "a memory estimate before training"),
    ("fault_tolerance", "enable"): ("refused", False, "torchft replica groups"),
    **{("fault_tolerance", k): ("irrelevant", "read only with fault tolerance on, which is refused") for k in (
        "process_group", "process_group_timeout_ms", "replica_id", "group_size", "min_replica_size",
        "semi_sync_method")},
    ("experimental", "custom_import"): ("refused", "", "a custom module imported into torchtitan"),
    ("experimental", "custom_args_module"): ("irrelevant", "extra configuration fields of a custom module"),
    **{("validation", k): ("irrelevant", "evaluation between training steps") for k in (
        "enable", "dataset", "dataset_path", "local_batch_size", "seq_len", "freq", "steps", "dataloader")},
    ("debug", "seed"): ("irrelevant", "the random seed: the same work per step"),
    ("debug", "deterministic"): ("refused", False, "deterministic kernels"),
    ("debug", "deterministic_warn_only"): ("irrelevant", "read only with deterministic kernels, which are refused"),
    ("debug", "moe_force_load_balance"): ("irrelevant", "sapp prices balanced expert routing"),
}


def check(doc: dict) -> None:
    """Refuses (one line) the first field set to something sapp does not price."""
    for sec, body in doc.items():
        if not isinstance(body, dict):
            continue
        for key, value in body.items():
            kind = FIELDS.get((sec, key))
            if isinstance(kind, tuple) and kind[0] == "refused" and value != kind[1]:
                raise EngineError(f"[{sec}] {key} = {value!r}: sapp does not price {kind[2]}; remove it to price "
                                  f"the rest")
