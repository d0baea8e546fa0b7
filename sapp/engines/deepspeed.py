"""DeepSpeed JSON configuration: a data-parallel plan written as DeepSpeed's config (ZeRO stage,
offload_optimizer, micro-batch, gradient accumulation, bf16/fp16 and bf16 master weights), and such a
file read back (json: data only).  The JSON states no tensor, pipeline, context or expert parallelism
(DeepSpeed's pipeline engine is set up in the training script): plans with them are refused (search
again with --target deepspeed).  Runtime: eager torch.

Every key of DeepSpeed's configuration surface is classified in deepspeed_fields.FIELDS (priced,
refused in one line, or irrelevant with the reason); `parse` checks the file against it first, so a
key that changes the step is never dropped silently: AutoTP, Ulysses sequence parallelism, ZeRO++,
ZenFlow and the keys DeepSpeed itself rejects as removed (mics_shard_size) are refused;
offload_optimizer cpu is priced at ZeRO-1, 2 and 3 as sapp's optimizer-host placement over each rank's
1/dp shard (what differs from DeepSpeed's offload: `offload_note`); offload_param (parameters on the host,
gathered per layer) is refused: sapp's placement has no parameter offload to price it with;
bf16.bf16_master_weights_and_grads / bf16_optimizer_states are priced as fewer optimizer bytes per
parameter (CostSettings optimizer "adam-bf16-master" 10 B, "adam-bf16-states" 6 B) and exported back;
`bf16.enabled: "auto"` (the Hugging Face Trainer's placeholder, which DeepSpeed alone reads as false) is
refused rather than priced as fp32."""
from __future__ import annotations

import json

from ..errors import shown
from . import deepspeed_fields
from .mapping import BF16_MASTER, EngineConfig, EngineError, uniform_policy

NAME = "deepspeed"
# DeepSpeed's engine never applies activation_checkpointing itself (deepspeed.initialize wraps no module;
# the section is read by deepspeed.checkpointing.configure): without the script's calls nothing is
# recomputed and the exported plan's memory does not hold, so the file says what the script must do
AC_SCRIPT = ("TRAINING SCRIPT: this plan recomputes every block (activation_checkpointing); DeepSpeed does so only "
             "where the script calls deepspeed.checkpointing.configure(None, deepspeed_config=<this file>) once and "
             "runs each transformer block as deepspeed.checkpointing.checkpoint(block, *inputs); without those calls "
             "nothing is recomputed and the priced memory does not hold")
# DeepSpeed 0.19.8 refuses a torch optimizer beside offload_optimizer (engine.py, zero_force_ds_cpu_optimizer):
# the offloaded step sapp prices is CPU Adam, which the script must hand over or let the JSON build
OFFLOAD_SCRIPT = ("TRAINING SCRIPT: offload_optimizer steps Adam on the host: pass deepspeed.ops.adam.DeepSpeedCPUAdam "
                  "(or an optimizer section of type AdamW) to deepspeed.initialize; DeepSpeed refuses a torch optimizer "
                  "here")


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
    if out.optimizer in BF16_MASTER and (out.zero == 0 or out.precision != "bf16-mixed"):
        raise EngineError("DeepSpeed keeps bf16 master weights under bf16 with ZeRO-1, 2 or 3 only; the plan has "
                          f"{out.precision} at ZeRO-{out.zero}: search again with --target deepspeed")
    if out.offload_optimizer and out.zero == 0 and out.dp > 1:
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
    if ecfg.offload_optimizer and ecfg.zero == 0:       # one GPU: DeepSpeed offloads under a ZeRO stage only
        cfg["zero_optimization"]["stage"] = 1
    if ecfg.offload_optimizer:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if ecfg.precision == "bf16-mixed":
        cfg["bf16"] = {"enabled": True}
        if ecfg.optimizer in BF16_MASTER:
            cfg["bf16"]["bf16_master_weights_and_grads"] = True
            cfg["bf16"]["bf16_optimizer_states"] = ecfg.optimizer == "adam-bf16-states"
    elif ecfg.precision == "fp16-mixed":
        cfg["fp16"] = {"enabled": True}
    comment = list(header)
    if ecfg.offload_optimizer:
        comment.append(OFFLOAD_SCRIPT)
    if ecfg.recompute == "full":
        # read by deepspeed.checkpointing, which the training script calls on every block
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
        comment.append(AC_SCRIPT)
    if comment:             # JSON has no comments: DeepSpeed ignores the key, and a reader of the file sees it
        cfg["_comment"] = " | ".join(comment)
    return json.dumps(cfg, indent=1, sort_keys=True) + "\n"


def parse(text: str, facts: dict, devices: int) -> EngineConfig:
    try:
        cfg = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(EngineError(f"{c} is not a number")))
    except json.JSONDecodeError as e:
        raise EngineError(f"not a JSON file ({e.msg} at line {e.lineno})") from None
    if not isinstance(cfg, dict):
        raise EngineError("a DeepSpeed config is a JSON object")
    if isinstance(cfg.get("zero_optimization"), bool):
        # DeepSpeed's old form: true is ZeRO-1 (deepspeed.runtime.zero.config.read_zero_config_deprecated)
        cfg = {**cfg, "zero_optimization": {"stage": 1} if cfg["zero_optimization"] else {}}
    notes = deepspeed_fields.check(cfg)

    def num(key):
        v = cfg.get(key)
        if v is None or v == "auto":
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise EngineError(f"{key} must be a positive whole number, got {shown(v)}")
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
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        raise EngineError(f"zero_optimization.stage must be 0..3, got {shown(stage)}")
    off = (zo.get("offload_optimizer") or {}).get("device", "none")
    if off not in ("none", "cpu", "nvme", None):    # DeepSpeed's own enum: a list or "CPU" fails its validation
        raise EngineError(f"zero_optimization.offload_optimizer.device must be \"none\", \"cpu\" or \"nvme\" as "
                          f"DeepSpeed reads it, got {str(off)[:40]!r}")
    if zo.get("cpu_offload") not in (None, False, "auto"):
        if "offload_optimizer" in zo:       # DeepSpeed asserts the same
            raise EngineError("zero_optimization.cpu_offload is the old offload_optimizer; give one of them")
        off = "cpu"
    if off == "nvme":
        raise EngineError("offload_optimizer to nvme is not priced by sapp; use cpu")
    precision, optimizer = _precision(cfg, stage)
    if off == "cpu" and dp > 1 and stage > 0:
        notes.append(offload_note(stage, dp, precision))
    if dp == 1 and stage > 0:
        # ZeRO-N over one rank partitions nothing (DeepSpeed runs it, e.g. to offload the optimizer)
        notes.append(f"ZeRO-{stage} on one GPU shards nothing: priced as ZeRO-0"
                     + (" with the optimizer on the host" if off == "cpu" else ""))
        stage = 0
    _optimizer_type(cfg)
    comm = cfg.get("communication_data_type")
    if comm is not None and str(comm).lower() != {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(precision, "fp32"):
        raise EngineError(f"communication_data_type = {str(comm)[:20]!r}: sapp prices the gradient reduction in the "
                          f"training precision ({precision}); remove it")
    if "activation_checkpointing" in cfg:
        notes.append("activation_checkpointing is applied by the training script's deepspeed.checkpointing calls: "
                     "priced as full recomputation of every block")
    return EngineConfig(engine=NAME, global_batch=gb, dp=dp, mbs=mbs, m=ga, zero=stage, offload_optimizer=off == "cpu",
                        recompute="full" if "activation_checkpointing" in cfg else "none", precision=precision,
                        optimizer=optimizer, runtime="eager", notes=notes)


def offload_note(stage: int, dp: int, precision: str) -> str:
    """What sapp prices for DeepSpeed's offload_optimizer cpu over dp ranks and how DeepSpeed 0.19.8 differs.
    DeepSpeed (ZeRO-1/2: stage_1_and_2.py; ZeRO-3: stage3.py, whose grad_partitions_flat_buffer lives on
    the offload device) keeps each rank's fp32 master, Adam moments and gradient partition on its host, steps
    CPU Adam over that 1/dp partition and copies the updated half-precision partition back (ZeRO-3: the
    partition it gathers per layer).  sapp's optimizer-host placement at dp > 1
    (placement/cost.optimizer_offload_cost) prices the same bytes on the host and the same CPU Adam and
    weight copy, but one gradient copy after backward, all in series, and the gradient shard left on the
    device: DeepSpeed moves the gradient partition to the host (and back, to accumulate) in every
    micro-batch's backward, overlapped with it, and frees it on the device."""
    half = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(precision, "fp32")
    return (f"offload_optimizer cpu at ZeRO-{stage} priced as sapp's optimizer-host placement over each rank's "
            f"1/{dp} shard: after backward its gradient shard copied to the host, CPU Adam, its updated {half} "
            f"parameter shard copied back, in series; not priced: DeepSpeed's gradient-partition copies during "
            f"every micro-batch's backward (overlapped) and the gradient shard it frees on the device (priced as "
            f"staying there)")


def _precision(cfg, stage) -> tuple:
    """(precision, CostSettings optimizer) as DeepSpeed reads the bf16 (else bfloat16) and fp16 sections."""
    bf = cfg.get("bf16") if "bf16" in cfg else cfg.get("bfloat16")
    bf, fp = bf or {}, cfg.get("fp16") or {}
    for name, sec in (("bf16", bf), ("fp16", fp)):
        if sec.get("enabled") == "auto":
            raise EngineError(f"{name}.enabled is \"auto\", which the Hugging Face Trainer fills from --{name} "
                              f"(DeepSpeed alone reads it as false, fp32): write true or false")
    if bf.get("enabled") is True and fp.get("enabled") is True:
        raise EngineError("bf16 and fp16 are both enabled; DeepSpeed runs one of them")
    precision = "bf16-mixed" if bf.get("enabled") is True else "fp16-mixed" if fp.get("enabled") is True else "fp32"
    master, states = (bf.get(k) is True for k in ("bf16_master_weights_and_grads", "bf16_optimizer_states"))
    if states and not master:       # DeepSpeed asserts the same
        raise EngineError("bf16.bf16_optimizer_states needs bf16.bf16_master_weights_and_grads true")
    if master and (stage == 0 or precision != "bf16-mixed"):
        raise EngineError("bf16.bf16_master_weights_and_grads needs bf16.enabled true and ZeRO stage 1, 2 or 3")
    return precision, "adam-bf16-states" if states else "adam-bf16-master" if master else "adam"


def _optimizer_type(cfg) -> None:
    """sapp prices Adam's two states: another optimizer DeepSpeed builds from the JSON is refused."""
    kind = (cfg.get("optimizer") or {}).get("type")
    if kind is not None and str(kind).lower() not in ("adam", "adamw"):
        raise EngineError(f"optimizer.type = {str(kind)[:40]!r}: sapp prices Adam / AdamW; use one of them")
