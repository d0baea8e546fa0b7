"""Every field of torchtitan 0.3's typed job configuration (`Trainer.Config` and the config classes of
its sections), classified for `sapp import --from torchtitan`: priced (read by torchtitan_py.parse),
refused in one line when set to anything but torchtitan's default, or irrelevant to the priced step,
with the reason.  The field list itself, read off torchtitan 0.3.0's own dataclasses, is stored in
bench/torchtitan_fields/v0.3.0.json (0.3 is not installable beside the pinned 0.2.2);
tests/test_engines_torchtitan_py.py fails on a field there that is missing here.

Sections are Trainer.Config's field names; "trainer" holds its plain fields, "param_group" the fields
of one optimizer parameter group.  CLASSES: the constructors a file may name for each section."""
from __future__ import annotations

from ..errors import shown
from .mapping import EngineError

P = "priced"
_RUN = ("irrelevant", "run bookkeeping (paths, logging, output): no work inside a step")
_DATA = ("irrelevant", "data loading (overlapped with the step)")
FIELDS = {
    ("trainer", "model_spec"): P,
    ("trainer", "hf_assets_path"): ("irrelevant", "tokenizer and weight files"),
    ("trainer", "dump_folder"): _RUN,
    **{("profiler", k): ("irrelevant", "profiler and memory-snapshot output on the profiled steps only") for k in (
        "enable_profiling", "save_traces_folder", "profile_freq", "profiler_repeat", "profiler_skip_first",
        "profiler_skip_first_wait", "profiler_active", "profiler_warmup", "enable_memory_snapshot",
        "memory_snapshot_freq", "save_memory_snapshot_folder", "memory_snapshot_max_entries", "trace_post_processor")},
    **{("metrics", k): _RUN for k in ("log_freq", "enable_tensorboard", "disable_color_printing", "save_tb_folder",
                                      "save_for_all_ranks", "enable_wandb")},
    **{("dataloader", k): _DATA for k in ("dataset", "dataset_path", "infinite", "num_workers", "persistent_workers",
                                          "pin_memory", "prefetch_factor")},
    ("optimizer", "param_groups"): P,
    ("optimizer", "implementation"): ("irrelevant", "the same Adam update, one kernel or per-tensor loops"),
    ("optimizer", "optimizer_factory_kwargs_by_name"): (
        "irrelevant", "extra constructor arguments of the named optimizers (the name itself is checked)"),
    ("param_group", "optimizer_name"): P,
    ("param_group", "pattern"): ("irrelevant", "which parameters a group holds: every group's optimizer is checked"),
    ("param_group", "optimizer_kwargs"): ("irrelevant", "optimizer hyperparameters: the same update work per step"),
    **{("lr_scheduler", k): ("irrelevant", "the learning-rate schedule: no work inside a step")
       for k in ("warmup_steps", "total_steps", "decay_ratio", "decay_type", "min_lr_factor")},
    **{("training", k): P for k in ("local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param",
                                    "mixed_precision_reduce", "disable_cuda_graphs")},
    # torchtitan main's token-count names of the same batch (after 0.3.0), read and priced alike
    **{("training", k): P for k in ("num_tokens_per_microbatch_per_dp_rank", "num_tokens_per_train_step",
                                    "max_context_length")},
    ("parallelism", "num_pp_microbatches"): P,
    ("training", "max_norm"): ("irrelevant", "gradient clipping: one norm over the gradients, not modelled"),
    ("training", "steps"): ("irrelevant", "the run's length"),
    ("training", "enable_cpu_offload"): ("refused", False, "parameter and optimizer CPU offload"),
    ("training", "dtype"): P,          # "bfloat16": pure bf16 training (torchtitan.parse's _optimizer)
    ("training", "gc_freq"): ("irrelevant", "Python garbage collection between steps"),
    ("training", "gc_debug"): ("irrelevant", "Python garbage collection between steps"),
    **{("parallelism", k): P for k in (
        "data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
        "tensor_parallel_degree", "enable_sequence_parallel", "pipeline_parallel_degree", "module_fqns_per_model_part",
        "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
        "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
        "context_parallel_degree", "expert_parallel_degree")},
    ("parallelism", "enable_fsdp_symm_mem"): ("refused", False, "FSDP2's symmetric-memory collectives"),
    ("parallelism", "spmd_backend"): (
        "irrelevant", "which SPMD layer (spmd_types or DTensor) states the same shardings and collectives"),
    ("parallelism", "pipeline_parallel_schedule_csv"): ("refused", "", "a pipeline schedule read from a CSV file"),
    ("parallelism", "context_parallel_load_balancer"): (
        "refused", "headtail", "context parallelism without head-tail load balancing of causal attention"),
    ("parallelism", "context_parallel_ptrr_mask_key"): (
        "irrelevant", "read only by the ptrr load balancer, which is refused"),
    **{("checkpoint", k): ("irrelevant", "checkpoint loading and saving between steps") for k in (
        "enable", "enable_first_step_checkpoint", "folder", "interval", "initial_load_path", "initial_load_model_only",
        "initial_load_in_hf", "initial_load_in_hf_quantized", "last_save_model_only", "last_save_in_hf",
        "export_dtype", "async_mode", "keep_latest_k", "load_step", "exclude_from_loading", "create_seed_checkpoint",
        "load_only")},
    ("activation_checkpoint", "preserve_rng_state"): ("irrelevant", "RNG bookkeeping for recomputed dropout"),
    ("activation_checkpoint", "determinism_check"): ("irrelevant", "a debug check of recomputation"),
    ("activation_checkpoint", "debug"): ("irrelevant", "debug output"),
    ("activation_checkpoint", "force_recompute_mm_shapes_by_fqns"): (
        "irrelevant", "linear layers whose GEMMs selective checkpointing recomputes (default: MoE router gates, a "
                      "few columns wide): not priced"),
    ("activation_checkpoint", "memory_budget"): ("irrelevant", "read only by MemoryBudgetAC, which is refused"),
    ("activation_checkpoint", "visualize_memory_budget_pareto"): (
        "irrelevant", "read only by MemoryBudgetAC, which is refused"),
    ("compile", "enable"): P, ("compile", "enable_async_tensor_parallel"): P,
    ("compile", "components"): ("irrelevant", "read only with compile on, priced as eager with a note"),
    ("compile", "backend"): ("irrelevant", "read only with compile on, priced as eager with a note"),
    **{("comm", k): ("irrelevant", "collective timeouts and traces") for k in (
        "init_timeout_seconds", "train_timeout_seconds", "trace_buf_size", "save_traces_folder",
        "save_traces_file_prefix")},
    ("comm", "mode"): ("refused", "default", "a fake, local or torchcomms communication backend"),
    **{("validator", k): ("irrelevant", "evaluation between training steps") for k in (
        "enable", "freq", "steps", "dataloader")},
    ("debug", "seed"): ("irrelevant", "the random seed: the same work per step"),
    ("debug", "spmd_typechecking"): ("irrelevant", "a check of the sharding annotations"),
    ("debug", "deterministic"): ("refused", False, "deterministic kernels"),
    ("debug", "deterministic_warn_only"): ("irrelevant", "read only with deterministic kernels, which are refused"),
    ("debug", "moe_force_load_balance"): ("irrelevant", "sapp prices balanced expert routing"),
    ("debug", "detect_anomaly"): ("refused", False, "autograd anomaly detection"),
    ("debug", "batch_invariant"): ("refused", False, "batch-invariant kernels"),
    ("debug", "print_config"): _RUN, ("debug", "save_config_file"): _RUN,
    ("debug", "enable_structured_logging"): ("irrelevant", "per-rank trace logging"),
    ("override", "imports"): ("refused", [], "functions imported into torchtitan to replace its components"),
    ("loss", "loss_fn"): P, ("loss", "num_chunks"): P,
    ("loss", "global_vocab_size"): ("irrelevant", "the model's vocabulary, stated again for the loss"),
}

# the classes a file may construct for each section (what its field holds); "" is the section's default
CLASSES = {
    "profiler": ("Profiler.Config",), "metrics": ("MetricsProcessor.Config",),
    "tokenizer": ("HuggingFaceTokenizer.Config",),
    "dataloader": ("HuggingFaceTextDataLoader.Config", "BaseDataLoader.Config"),
    "optimizer": ("OptimizersContainer.Config",), "lr_scheduler": ("LRSchedulersContainer.Config",),
    "training": ("TrainingConfig",), "parallelism": ("ParallelismConfig",),
    "checkpoint": ("CheckpointManager.Config",),
    "activation_checkpoint": ("SelectiveAC.Config", "FullAC.Config", "MemoryBudgetAC.Config"),
    "compile": ("CompileConfig",), "comm": ("CommConfig",), "validator": ("Validator.Config",),
    "debug": ("DebugConfig",), "override": ("OverrideConfig",),
    "loss": ("CrossEntropyLoss.Config", "ChunkedLossWrapper.Config"),
}


def check(sec: str, key: str, value) -> None:
    """Refuses (one line) a field sapp does not know, or one set to something sapp does not price."""
    kind = FIELDS.get((sec, key))
    if kind is None:
        raise EngineError(f"{sec}.{key} is not a field of torchtitan 0.3's job configuration; remove it (or export "
                          f"with this sapp to see the fields it writes)")
    if isinstance(kind, tuple) and kind[0] == "refused" and value != kind[1]:
        raise EngineError(f"{sec}.{key} = {shown(value)}: sapp does not price {kind[2]}; remove it to price the rest")
