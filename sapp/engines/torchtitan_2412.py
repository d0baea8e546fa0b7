"""torchtitan's job TOML as it was written until February 2025: the schema of torchtitan's published
Llama 3.1 benchmark (benchmarks/llama3_h100_202412_torchtitan.md, run at torchtitan 9dec370 on torch
1963fc8, Dec 2024), read into 0.2.2's sections (sapp/engines/torchtitan.py prices those), with the
runtime profile the file's own fields state.

Told from 0.2.2's schema by its fields, each of which 0.2.2's JobConfig no longer has: [training]
batch_size, compile and the data-parallel / tensor-parallel degrees, [experimental]
pipeline_parallel_degree / context_parallel_degree, [model] norm_type, and the [float8] table (ERA_KEYS;
torchtitan moved the degrees to [parallelism] on 2025-03-18, replaced [float8] by model converters on
2025-02-14 and removed norm_type on 2025-04-23).  A file that mixes the two schemas is refused.

The profile (costmodel/settings.py, costmodel/torchtitan.py), read off the code at 9dec370:
- `norm_type = "rmsnorm"` (the default) builds torchtitan's own RMSNorm class (models/norms.py
  build_norm): `self._norm(x.float()).type_as(x) * self.weight`, one eager kernel per op in fp32;
  "fused_rmsnorm" (its Triton kernel), "layernorm" and "np_layernorm" are refused (not priced, or not
  the Llama 3 model priced).
- Attention: the model calls F.scaled_dot_product_attention(is_causal=True), which torch of that time
  ran as FlashAttention-2 on Hopper (cuDNN's kernel was opt-in from 2.5.1 until torch preferred it
  again on Hopper: costmodel/torchtitan.py); torchtitan of this schema ran on the torch nightly of its
  day, the benchmark on 1963fc8 (2024-12-23).
- `compile = true` (parallelize_llama.apply_compile: torch.compile(fullgraph=True) on each
  TransformerBlock): inductor fuses the blocks' RMSNorm into one kernel: "torchtitan-2412+compile".
  Not priced: the other point-wise chains it fuses (the SwiGLU product, rotary, residual adds, the
  Float8 casts), priced as eager kernels, so a compiled step may run faster than priced; the final
  norm, outside the blocks, runs eager and is priced fused with them.
- Everything else as 0.2.2 runs it (FSDP2 over every block, resharding after forward but the last
  block, as parallelize_llama.apply_fsdp does without pipelining; fp32 gradient reduction; op-level
  selective checkpointing; the loss on fp32 logits; foreach AdamW).
- `[float8] enable_float8_linear = true` with the default dynamic scaling and no FSDP float8
  all-gather is torchao's tensorwise Float8Linear on every linear but `output` (float8.py
  module_filter_fn), what sapp's "tensorwise" recipe prices; delayed scaling and the float8 all-gather
  are refused.
- Pipeline parallelism in this schema (split points, a micro-batch count) is refused: price a
  pipelined run with 0.2.2's schema."""
from __future__ import annotations

from .mapping import EngineError

PROFILE, PROFILE_COMPILE = "torchtitan-2412", "torchtitan-2412+compile"
STATES = "torchtitan's TOML of before 2025-02 (the schema of its Dec 2024 benchmark, torchtitan 9dec370)"
ERA_KEYS = (("training", "batch_size"), ("training", "compile"), ("training", "tensor_parallel_degree"),
            ("training", "data_parallel_shard_degree"), ("training", "data_parallel_replicate_degree"),
            ("experimental", "pipeline_parallel_degree"), ("experimental", "context_parallel_degree"),
            ("model", "norm_type"), ("float8", None))
V022_KEYS = (("parallelism", None), ("compile", None), ("training", "local_batch_size"),
             ("training", "global_batch_size"), ("model", "converters"), ("quantize", None))
# (section, key) -> (0.2.2 section, key): the same field under its later name
MOVED = {("training", "batch_size"): ("training", "local_batch_size"),
         ("training", "disable_loss_parallel"): ("parallelism", "disable_loss_parallel"),
         ("training", "deterministic"): ("debug", "deterministic"),
         ("checkpoint", "enable_checkpoint"): ("checkpoint", "enable"),
         **{("training", k): ("parallelism", k) for k in (
             "data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree")},
         **{("experimental", k): ("parallelism", k) for k in (
             "pipeline_parallel_degree", "context_parallel_degree", "context_parallel_rotate_method",
             "enable_async_tensor_parallel")}}
_SAME = ("seq_len", "max_norm", "steps", "dataset", "dataset_path", "gc_freq", "enable_cpu_offload",
         "mixed_precision_param", "mixed_precision_reduce")
# fields of 9dec370's config_manager.py that 0.2.2 does not have and that do not change the step
DROPPED = {("training", "compile"), ("training", "warmup_steps"), ("training", "seed"), ("job", "print_args"),
           ("job", "use_for_integration_test"), ("metrics", "rank_0_only"), ("checkpoint", "interval_type"),
           ("checkpoint", "model_weights_only"), ("memory_estimation", "enabled"),
           ("experimental", "pipeline_parallel_split_points"), ("experimental", "pipeline_parallel_schedule"),
           ("experimental", "pipeline_parallel_schedule_csv"), ("experimental", "pipeline_parallel_microbatches"),
           ("float8", "precompute_float8_dynamic_scale_for_fsdp"), ("float8", "enable_float8_linear"),
           ("float8", "enable_fsdp_float8_all_gather"), ("float8", "scaling_type_input"),
           ("float8", "scaling_type_weight"), ("float8", "scaling_type_grad_output"), ("model", "norm_type"),
           ("optimizer", "fused"), ("experimental", "enable_compiled_autograd")}
# (section, key): (the default, what sapp does not price) when set to anything else
REFUSED = {("optimizer", "fused"): (False, "fused AdamW (one kernel; sapp prices torchtitan's foreach update)"),
           ("experimental", "enable_compiled_autograd"): (False, "compiled autograd"),
           ("float8", "enable_fsdp_float8_all_gather"): (False, "FSDP's all-gather of float8 weights"),
           **{("float8", k): ("dynamic", "delayed float8 scaling (sapp prices dynamic tensorwise scales)")
              for k in ("scaling_type_input", "scaling_type_weight", "scaling_type_grad_output")}}
NORMS = ("rmsnorm", "fused_rmsnorm", "layernorm", "np_layernorm")


def _has(doc, sec, key) -> bool:
    body = doc.get(sec)
    return isinstance(body, dict) and (key is None or key in body)


def is_era(doc: dict) -> bool:
    """The file is written in the 2024 schema (ERA_KEYS); one line refusing a file of both schemas."""
    old = [f"[{s}]" + (f" {k}" if k else "") for s, k in ERA_KEYS if _has(doc, s, k)]
    if not old:
        return False
    new = [f"[{s}]" + (f" {k}" if k else "") for s, k in V022_KEYS if _has(doc, s, k)]
    if new:
        raise EngineError(f"the file mixes torchtitan's 2024 schema ({old[0]}) with 0.2.2's ({new[0]}); write "
                          f"one of them")
    return True


def translate(doc: dict) -> tuple:
    """(the file as 0.2.2's sections, the runtime profile its fields state, notes)."""
    for (sec, key), (default, what) in REFUSED.items():
        v = (doc.get(sec) or {}).get(key, default)
        if v != default:
            raise EngineError(f"[{sec}] {key} = {str(v)[:40]!r}: sapp does not price {what}; remove it to price the rest")
    model = doc.get("model") or {}
    norm = model.get("norm_type", "rmsnorm")
    if norm != "rmsnorm":
        what = ("torchtitan's Triton fused RMSNorm" if norm == "fused_rmsnorm" else
                "a LayerNorm, not the Llama 3 model priced" if norm in NORMS else "no norm torchtitan builds")
        raise EngineError(f"[model] norm_type = {str(norm)[:40]!r}: {what}; sapp prices norm_type = \"rmsnorm\" "
                          f"(torchtitan's eager RMSNorm)")
    exp = doc.get("experimental") or {}
    if exp.get("pipeline_parallel_degree", 1) != 1:
        raise EngineError("[experimental] pipeline_parallel_degree > 1: sapp does not read the 2024 schema's "
                          "pipeline split points and micro-batch count; write the pipeline in 0.2.2's [parallelism]")
    out = {}
    for sec, body in doc.items():
        if not isinstance(body, dict):
            continue
        for key, value in body.items():
            if (sec, key) in DROPPED:
                continue
            to = MOVED.get((sec, key)) or (("training", key) if sec == "training" and key in _SAME else
                                           None if sec in ("training", "experimental", "float8") else (sec, key))
            if to is None:
                raise EngineError(f"[{sec}] {key}: not a field of torchtitan's 2024 schema (9dec370's "
                                  f"config_manager.py); remove it")
            out.setdefault(to[0], {})[to[1]] = value
    f8 = doc.get("float8") or {}
    if f8.get("enable_float8_linear", False):
        out.setdefault("model", {})["converters"] = ["quantize.linear.float8"]
        out["quantize"] = {"linear": {"float8": {"filter_fqns": ["output"]}}}
    compiled = (doc.get("training") or {}).get("compile", False)
    if not isinstance(compiled, bool):
        raise EngineError(f"[training] compile = {str(compiled)[:40]!r}: true or false")
    profile = PROFILE_COMPILE if compiled else PROFILE
    notes = [f"{STATES}: priced as that stack runs it ({profile}: norm_type \"rmsnorm\", torchtitan's "
             + ("RMSNorm fused by torch.compile in each block" if compiled else "eager fp32 RMSNorm")
             + ", SDPA as FlashAttention-2, torch of that time; sapp/engines/torchtitan_2412.py)"]
    if compiled:
        notes.append("torch.compile is on (each TransformerBlock): the norm priced fused; the other point-wise "
                     "chains compile fuses (SwiGLU, rotary, residual adds" + (", the float8 casts" if f8.get(
                         "enable_float8_linear") else "") + ") priced as eager kernels, so the step may run faster "
                     "than priced")
    return out, profile, notes
