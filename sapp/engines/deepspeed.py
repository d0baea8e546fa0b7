"""DeepSpeed JSON configuration: a data-parallel plan written as DeepSpeed's config (ZeRO stage,
offload_optimizer, micro-batch, gradient accumulation, bf16/fp16), and such a file read back (json:
data only).  The JSON states no tensor, pipeline, context or expert parallelism (DeepSpeed's
pipeline engine is set up in the training script): plans with them are refused (search again with
--target deepspeed).  Runtime: eager torch."""
from __future__ import annotations

import json

from .mapping import EngineConfig, EngineError, uniform_policy

NAME = "deepspeed"


def conform(ecfg: EngineConfig, names) -> tuple:
    for k in ("tp", "pp", "cp", "ep"):
        if getattr(ecfg, k) > 1:
            raise EngineError(f"a DeepSpeed config states data parallelism only; the plan uses {k}={getattr(ecfg, k)}: "
                              f"search again with --target deepspeed")
    notes = []
    out = ecfg.replace()
    if out.runtime != "eager":
        notes.append(f"the plan was priced for the {out.runtime} runtime; DeepSpeed runs eager torch: re-priced as eager")
        out.runtime = "eager"
    if out.offload_optimizer and out.zero == 0:
        raise EngineError("DeepSpeed offloads the optimizer under ZeRO-1, 2 or 3 only; the plan offloads it at ZeRO-0: "
                          "search again with --target deepspeed")
    pol = uniform_policy(out.recompute)
    if pol not in ("none", "full"):
        notes.append(f"DeepSpeed checkpoints whole blocks on every layer or none: recomputation "
                     f"{pol or 'per block'} exported as full on every layer")
    out.recompute = pol if pol in ("none", "full") else "full"
    return out, notes


def export(ecfg: EngineConfig, facts: dict, names, header=()) -> str:
    cfg = {"train_batch_size": ecfg.global_batch, "train_micro_batch_size_per_gpu": ecfg.mbs,
           "gradient_accumulation_steps": ecfg.m,
           "zero_optimization": {"stage": ecfg.zero}}
    if ecfg.offload_optimizer:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if ecfg.precision == "bf16-mixed":
        cfg["bf16"] = {"enabled": True}
    elif ecfg.precision == "fp16-mixed":
        cfg["fp16"] = {"enabled": True}
    if ecfg.recompute == "full":
        # read by deepspeed.checkpointing, which the training script calls on every block
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
    if header:
        cfg["_comment"] = " | ".join(header)
    return json.dumps(cfg, indent=1, sort_keys=True) + "\n"


def parse(text: str, facts: dict, devices: int) -> EngineConfig:
    try:
        cfg = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(EngineError(f"{c} is not a number")))
    except json.JSONDecodeError as e:
        raise EngineError(f"not a JSON file ({e.msg} at line {e.lineno})") from None
    if not isinstance(cfg, dict):
        raise EngineError("a DeepSpeed config is a JSON object")

    def num(key):
        v = cfg.get(key)
        if v is None or v == "auto":
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise EngineError(f"{key} must be a positive whole number, got {v!r}")
        return v
    gb, mbs, ga = num("train_batch_size"), num("train_micro_batch_size_per_gpu"), num("gradient_accumulation_steps")
    dp = devices
    # DeepSpeed's rule: train_batch_size = micro-batch x accumulation x data-parallel size, any two given
    if gb is None and mbs is not None:
        gb = mbs * (ga or 1) * dp
    if mbs is None and gb is not None:
        mbs = gb // ((ga or 1) * dp)
    if gb is None or mbs is None or mbs < 1:
        raise EngineError("give train_batch_size or train_micro_batch_size_per_gpu (numbers, not 'auto')")
    ga = ga or gb // (mbs * dp)
    if gb != mbs * ga * dp:
        raise EngineError(f"train_batch_size {gb} != micro-batch {mbs} x accumulation {ga} x {dp} GPUs; pass the "
                          f"--cluster this file ran on")
    zo = cfg.get("zero_optimization") or {}
    stage = zo.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise EngineError(f"zero_optimization.stage must be 0..3, got {stage!r}")
    if (zo.get("offload_param") or {}).get("device", "none") not in ("none", None):
        raise EngineError("zero_optimization.offload_param is not priced by sapp; remove it to price the rest")
    off = (zo.get("offload_optimizer") or {}).get("device", "none")
    if off not in ("none", "cpu", "nvme", None):    # DeepSpeed's own enum: a list or "CPU" fails its validation
        raise EngineError(f"zero_optimization.offload_optimizer.device must be \"none\", \"cpu\" or \"nvme\" as "
                          f"DeepSpeed reads it, got {str(off)[:40]!r}")
    if off == "nvme":
        raise EngineError("offload_optimizer to nvme is not priced by sapp; use cpu")
    notes = []
    if off == "cpu" and stage == 3:
        raise EngineError("optimizer offload beside ZeRO-3 is not priced by sapp; use stage 1 or 2 with it")
    bf16 = (cfg.get("bf16") or {}).get("enabled") is True
    fp16 = (cfg.get("fp16") or {}).get("enabled") is True
    if "activation_checkpointing" in cfg:
        notes.append("activation_checkpointing is applied by the training script's deepspeed.checkpointing calls: "
                     "priced as full recomputation of every block")
    return EngineConfig(engine=NAME, global_batch=gb, dp=dp, mbs=mbs, m=ga, zero=stage, offload_optimizer=off == "cpu",
                        recompute="full" if "activation_checkpointing" in cfg else "none",
                        precision="bf16-mixed" if bf16 else "fp16-mixed" if fp16 else "fp32", runtime="eager",
                        notes=notes)
