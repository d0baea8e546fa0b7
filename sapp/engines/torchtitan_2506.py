"""torchtitan's job TOML as it was written in mid-2025: the schema of its published async-TP benchmark
(benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, run at torchtitan 820504e on torch 38410cf9,
June 2025), read into 0.2.2's sections (sapp/engines/torchtitan.py prices those), with the runtime
profile and the FP8 recipe the file's own fields state.

Told apart by [parallelism] (0.2.2's, from 2025-03-18) beside a field 0.2.2 no longer has: [training]
compile (0.2.2: [compile] enable / components) or the [float8] table (0.2.2: [quantize.linear.float8]).
The other fields 820504e names differently: [checkpoint] enable_checkpoint (0.2.2: enable) and
last_save_model_weights_only (last_save_model_only); [model] converters = ["float8"] (0.2.2 registers
"quantize.linear.float8").

What that code runs, read off 820504e (models/llama3/parallelize_llama.py, models/attention.py, the
model and components/loss.py):
- attention: torchtitan's ScaledDotProductAttention puts SDPA's backends in the order FLASH,
  EFFICIENT, MATH (cuDNN first only on B200): FlashAttention-2 on H100; the norms are nn.RMSNorm
  (aten's composite: the eager fp32 sequence).  Those are the kernels of the "torchtitan-2412"
  profiles (costmodel/torchtitan.py), which price it: `compile = true` (torch.compile(fullgraph) on
  each TransformerBlock, after activation checkpointing) is "torchtitan-2412+compile", its norms
  fused and its FP8 casts compiled (costmodel/fp8.py); compile off is "torchtitan-2412".
  Not priced: the loss, which 820504e compiles too (priced as eager passes), and the other point-wise
  chains compile fuses (SwiGLU, rotary, residual adds), priced as eager kernels.
- `converters = ["float8"]` is torchao's Float8Linear (recipe_name unset or "tensorwise": dynamic
  tensorwise scales), and with tensor parallelism apply_tp's enable_float8_tensorwise_tp is on (float8
  and not rowwise): torchao's Float8ColwiseParallel / Float8RowwiseParallel / PrepareFloat8ModuleInput,
  the all-gathers moving fp8: the "tensorwise-tp" recipe.  (torchtitan 0.2.2 tests `"float8" in
  converters` against its renamed converter, so a 0.2.2 file runs bf16 tensor-parallel collectives.)
  Refused as 0.2.2's reader refuses them: rowwise recipes, FSDP's float8 all-gather, emulation, other
  filters; and force_recompute_fp8_weight_in_bwd (not priced)."""
from __future__ import annotations

from .mapping import EngineError

STATES = "torchtitan's TOML of mid-2025 (the schema of its June 2025 async-TP benchmark, torchtitan 820504e)"
PROFILE, PROFILE_COMPILE = "torchtitan-2412", "torchtitan-2412+compile"
RENAMED = {("checkpoint", "enable_checkpoint"): ("checkpoint", "enable"),
           ("checkpoint", "last_save_model_weights_only"): ("checkpoint", "last_save_model_only")}
FLOAT8_KEYS = ("enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp", "recipe_name",
               "filter_fqns", "emulate")


def is_2506(doc: dict) -> bool:
    """[parallelism] beside [training] compile or a [float8] table (module docstring)."""
    train = doc.get("training")
    return isinstance(doc.get("parallelism"), dict) and (
        (isinstance(train, dict) and "compile" in train) or isinstance(doc.get("float8"), dict))


def _converters(model: dict) -> list:
    conv = model.get("converters", [])
    if isinstance(conv, str):                       # the CLI form: "a,b"
        conv = [c.strip() for c in conv.split(",") if c.strip()]
    if not isinstance(conv, list) or any(c != "float8" for c in conv):
        raise EngineError(f"[model] converters = {str(conv)[:60]}: sapp prices torchtitan 820504e's \"float8\" "
                          f"converter only; remove the others to price the rest")
    return conv


def translate(doc: dict) -> tuple:
    """(the file as 0.2.2's sections, the runtime profile, notes, whether the tensor-parallel
    collectives move float8) of a file of this schema."""
    if isinstance(doc.get("compile"), dict) or isinstance(doc.get("quantize"), dict):
        raise EngineError("the file mixes torchtitan's mid-2025 schema ([training] compile / [float8]) with "
                          "0.2.2's ([compile] / [quantize]); write one of them")
    out = {}
    for sec, body in doc.items():
        if not isinstance(body, dict) or sec == "float8":
            continue
        for key, value in body.items():
            if (sec, key) == ("training", "compile"):
                continue
            to = RENAMED.get((sec, key), (sec, key))
            out.setdefault(to[0], {})[to[1]] = value
    model = out.get("model") or {}
    float8 = bool(_converters(model))
    f8 = doc.get("float8") or {}
    if f8.get("force_recompute_fp8_weight_in_bwd", False) is not False:
        raise EngineError("[float8] force_recompute_fp8_weight_in_bwd: sapp does not price the float8 weight "
                          "recomputed in backward; set it false to price the rest")
    unknown = [k for k in f8 if k not in FLOAT8_KEYS + ("force_recompute_fp8_weight_in_bwd",)]
    if unknown:
        raise EngineError(f"[float8] {unknown[0][:40]}: not a field of torchtitan 820504e's Float8 config; remove it")
    if float8:
        model["converters"] = ["quantize.linear.float8"]
        out["quantize"] = {"linear": {"float8": {k: f8[k] for k in FLOAT8_KEYS if k in f8}}}
    elif "converters" in model:
        del model["converters"]
    compiled = (doc.get("training") or {}).get("compile", False)
    if not isinstance(compiled, bool):
        raise EngineError(f"[training] compile = {str(compiled)[:40]!r}: true or false")
    profile = PROFILE_COMPILE if compiled else PROFILE
    notes = [f"{STATES}: priced as that stack runs it ({profile}: SDPA as FlashAttention-2, as torchtitan's "
             f"backend order on H100 chooses it, and nn.RMSNorm " + ("compiled in each block" if compiled else
                                                                     "as eager fp32 ops")
             + "; sapp/engines/torchtitan_2506.py)"]
    if compiled:
        notes.append("torch.compile is on (each TransformerBlock and the loss): the norms and the float8 casts "
                     "priced compiled; the loss and the other point-wise chains (SwiGLU, rotary, residual adds) "
                     "priced as eager kernels, so the step may run faster than priced")
    tp_float8 = float8 and f8.get("recipe_name") in (None, "tensorwise")
    return out, profile, notes, tp_float8
