"""torchtitan job TOML: a plan written as `[parallelism]`, `[training]`, `[activation_checkpoint]` and
`[compile]` sections, and such a file read back (tomllib: data only).

The sections and keys are those of torchtitan 0.2.2's JobConfig (`--job.config_file`), the last
release that reads a TOML file; 0.3.0 keeps the same [parallelism] / [training] field names but takes
them as `--parallelism.<key>` command-line overrides of a Python config registry.
Runtime: torchtitan 0.2.2's eager torch ("torchtitan-0.2.2", costmodel/settings.py: compile off, bf16
activations under FSDP2's mixed precision, fp32 gradient reduction, op-level selective checkpointing,
attention through SDPA).  Data parallelism: FSDP2 over data_parallel_shard_degree
(ZeRO-2: fsdp_reshard_after_forward "never", ZeRO-3: "always") or DDP over
data_parallel_replicate_degree (ZeRO-0); both > 1 is HSDP: FSDP2 within each shard group, the gradient
shards all-reduced across the replicas (priced so: search/joint/numbers.replica_sync); no ZeRO-1.  Tensor parallelism always
shards the norms' sequence (sequence parallelism on).  Pipeline stages: torchtitan spreads the layers
plus the embedding and the output (weights first/last_stage_less_layers) evenly over the (virtual)
stages, or takes module_fqns_per_model_part as given.  FP8: [model] converters =
["quantize.linear.float8"], torchao's tensorwise Float8Linear on the blocks' linears, the output
filtered (sapp/engines/fp8.py)."""
from __future__ import annotations

import math
import tomllib

from . import fp8
from .arch_hf import torchtitan_attention_agrees, unlike_llama3
from .mapping import EngineConfig, EngineError
from .torchtitan_2412 import PROFILE as _ERA, PROFILE_COMPILE as _ERA_COMPILE, is_era, translate
from .torchtitan_2506 import is_2506, translate as translate_2506

NAME = "torchtitan@0.2.2"      # (`--to torchtitan` is 0.3's Python configuration: torchtitan_py.py)
PURE_BF16 = "adam-bf16"         # training.dtype = "bfloat16" as a CostSettings optimizer (costmodel/settings.py)
RUNTIME = "torchtitan-0.2.2"  # the engine profile a torchtitan 0.2.2 plan is priced with (costmodel/settings.py)
RUNTIME_COMPILE = RUNTIME + "+compile"     # with [compile] enable for "model": each block compiled
# torch's get_schedule_class names; DualPipeV: 0.2.2's pipeline_module_split places its 2 stages a rank
# in the V (style "v", distributed/pipeline_parallel.py)
SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B", "dualpipev": "DualPipeV"}
_KERNELS = {"torchtitan": "torch's varlen FlashAttention (FlashAttention-3 on Hopper)",
            "torchtitan-0.2.2": "SDPA (cuDNN's kernel on Hopper)",
            "torchtitan-0.2.2+compile": "SDPA (cuDNN's kernel on Hopper) and compiled blocks",
            "torchtitan-2412": "SDPA's FlashAttention-2 and an eager RMSNorm (the Dec 2024 stack)",
            "torchtitan-2412+compile": "SDPA's FlashAttention-2 and compiled blocks (the Dec 2024 stack)"}


def retarget_note(was: str, runtime: str) -> str:
    """What re-pricing a plan of the `was` runtime as torchtitan's `runtime` profile changes."""
    if was in _KERNELS:        # another torchtitan profile: the same code but the attention (and norm) kernels
        return (f"the plan was priced for the {was} runtime; this torchtitan runs {_KERNELS[runtime]}: "
                f"re-priced so")
    return (f"the plan was priced for the {was} runtime; torchtitan runs eager torch (compile off) with fp32 "
            f"gradient reduction, its op-level selective checkpointing and {_KERNELS[runtime]}: re-priced so")


# ---- torchtitan's stage layout (its generate_llm_fqn_per_model_part rule, re-derived) ----------------
def stage_layers(L, stages, first_less=1, last_less=1):
    """Layers per stage when L layers plus the embedding (weight first_less) and the output
    (last_less) are spread evenly over `stages`, the remainder to the first stages."""
    eff = L + first_less + last_less
    per, extra = divmod(eff, stages)
    if per < 1 or first_less > per or last_less > per:
        return None
    out = []
    for s in range(stages):
        n = per + (s < extra)
        if s == 0:
            n -= first_less
        if s == stages - 1:
            n -= last_less
        out.append(n)
    if sum(out) != L or min(out) < 0:
        return None
    return out


def _layout_for(ecfg, L):
    """(layers_per_stage or None, first_less, last_less, explicit chunk list or None) that reproduce the
    configuration's chunk sizes."""
    n = ecfg.pp * ecfg.v
    want = list(ecfg.chunk_blocks) if ecfg.chunk_blocks else list(ecfg.device_blocks or [])
    if not want:
        return None, 1, 1, None
    for fl in (1, 0, 2):
        for ll in (1, 0, 2):
            got = stage_layers(L, n, fl, ll)
            if got == want:
                eff = L + fl + ll
                per = math.ceil(eff / n)
                if ecfg.v == 1:
                    return None, fl, ll, None
                if math.ceil(eff / per) == n:
                    return per, fl, ll, None
    return None, 1, 1, want


# torchtitan 0.2.2's llama3 flavors (models/llama3/__init__.py: llama3_args, ffn from its
# ffn_dim_multiplier / multiple_of rule; vocabulary 128256, RMSNorm eps 1e-5, rope base 500000, untied)
FLAVORS = {"8B": (32, 4096, 32, 8, 14336), "70B": (80, 8192, 64, 8, 28672), "405B": (126, 16384, 128, 8, 53248)}


def model_section(arch, why=None) -> tuple:
    """({"name", "flavor"} or None, a note when torchtitan has no flavor of this architecture; `why`: why
    sapp has no architecture of the model, the field named)."""
    if arch is not None:
        shape = (arch["layers"], arch["hidden"], arch["heads"], arch["kv_heads"], arch["ffn"])
        llama = (arch["norm"] == "RMSNorm" and arch["glu"] and arch["position"] == "rope" and not arch["bias"]
                 and not arch["qkv_bias"] and not arch["tied"] and not arch.get("experts") and arch["vocab"] == 128256
                 and arch["head_dim"] * arch["heads"] == arch["hidden"] and arch.get("rope_base") == 500000
                 and torchtitan_attention_agrees(arch))
        for flavor, f in FLAVORS.items():
            if llama and shape == f:
                return {"name": "llama3", "flavor": flavor}, None
    differs = arch and (unlike_llama3(arch) or ("tie_word_embeddings true (0.2.2's llama3 flavors are untied)"
                                                if arch["tied"] else None))
    what = (why or "sapp does not know its architecture") if arch is None else (
        f"{arch['layers']} layers, hidden {arch['hidden']}, {arch['heads']} heads / {arch['kv_heads']} kv, ffn "
        f"{arch['ffn']}, vocabulary {arch['vocab']}" + (f", {arch['experts']} experts" if arch.get("experts") else "")
        + (f"; {differs}" if differs else ""))
    return None, (f"this model is none of torchtitan's llama3 flavors ({what}): without a [model] name / flavor of "
                  f"this architecture torchtitan trains its 6-layer debug model, not the model priced")


# ---- export ----------------------------------------------------------------------------------------
def conform(ecfg: EngineConfig, names) -> tuple:
    notes = []
    out = ecfg.replace()
    if out.zero == 1:
        raise EngineError("torchtitan shards with FSDP2 (ZeRO-2/3) or replicates (DDP); the plan uses ZeRO-1: search "
                          "again with --target torchtitan")
    if out.offload_optimizer:
        raise EngineError("the plan offloads the optimizer only, which torchtitan cannot state (its CPU offload moves "
                          "parameters too); search again with --target torchtitan")
    if out.zero == 0 and out.dp * out.cp > 1 and (out.tp, out.pp, out.cp, out.ep) != (1, 1, 1, 1):
        # its parallelize: "DDP has not supported > 1D parallelism"; FSDP2 whenever cp is on
        notes.append("torchtitan replicates with DDP only as the one parallelism: ZeRO-0 exported as ZeRO-2 "
                     "(FSDP2, fsdp_reshard_after_forward never)")
        out.zero = 2
    if out.runtime not in (RUNTIME, RUNTIME_COMPILE, _ERA, _ERA_COMPILE):     # (a 2024 TOML's profile is kept)
        notes.append(retarget_note(out.runtime, RUNTIME))
        out.runtime = RUNTIME
    if out.tp > 1 and not out.sp:
        notes.append("torchtitan's tensor parallelism always runs the norms sequence-parallel: exported with it on")
        out.sp = True
    rc = out.recompute
    if not isinstance(rc, str):
        pols = [rc[b] for b in names]
        kinds = set(pols)
        if kinds <= {"none", "full"} and _every_nth(pols) is not None:
            pass
        else:
            new = "full" if "full" in kinds else "selective"
            notes.append(f"torchtitan recomputes every layer one way (or fully every N-th layer): per-block "
                         f"recomputation exported as {new} on every layer")
            out.recompute = new
    return out, notes


def _every_nth(pols):
    """N when exactly every N-th layer (layers N-1, 2N-1, ...: torchtitan's selective_ac_option = N) is
    fully recomputed and the rest not; else None."""
    for n in range(2, len(pols) + 1):
        if all((p == "full") == ((i + 1) % n == 0) for i, p in enumerate(pols)):
            return n
    return None


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def export(ecfg: EngineConfig, facts: dict, names, header=()) -> str:
    L = len(names)
    par = {"tensor_parallel_degree": ecfg.tp, "pipeline_parallel_degree": ecfg.pp,
           "context_parallel_degree": ecfg.cp, "expert_parallel_degree": ecfg.ep}
    if ecfg.zero == 0:
        par.update(data_parallel_replicate_degree=ecfg.dp, data_parallel_shard_degree=1)
    else:           # (HSDP: rep replicas of dp / rep shards)
        par.update(data_parallel_replicate_degree=ecfg.rep, data_parallel_shard_degree=ecfg.dp // ecfg.rep,
                   fsdp_reshard_after_forward="never" if ecfg.zero == 2 else "always")
    train = {"global_batch_size": ecfg.global_batch, "local_batch_size": ecfg.global_batch // ecfg.dp}
    if facts.get("seq"):
        train["seq_len"] = facts["seq"]
    train["mixed_precision_param"] = "bfloat16" if ecfg.precision != "fp32" else "float32"
    if ecfg.optimizer == PURE_BF16:     # weights, gradients and Adam's moments in bf16, no fp32 master
        train["dtype"] = "bfloat16"
    # (mixed_precision_reduce: 0.2.2 accepts only "float32", what the "torchtitan" runtime prices)
    if ecfg.pp > 1:
        par["pipeline_parallel_schedule"] = SCHEDULES[ecfg.schedule]
        par["pipeline_parallel_microbatch_size"] = ecfg.mbs
        lps, fl, ll, explicit = _layout_for(ecfg, L)
        par["pipeline_parallel_first_stage_less_layers"] = fl
        par["pipeline_parallel_last_stage_less_layers"] = ll
        if lps is not None:
            par["pipeline_parallel_layers_per_stage"] = lps
        if explicit is not None:
            parts, pos = [], 0
            for j, k in enumerate(explicit):
                mods = (["tok_embeddings"] if j == 0 else []) + [f"layers.{pos + q}" for q in range(k)] + (
                    ["norm", "output"] if j == len(explicit) - 1 else [])
                parts.append(mods)
                pos += k
            par["module_fqns_per_model_part"] = parts
    else:
        # no pipeline: the local batch runs in gradient-accumulation steps of the micro-batch
        train["local_batch_size"] = ecfg.mbs
    ac = {"mode": "none"}
    rc = ecfg.recompute
    if rc == "full":
        ac = {"mode": "full"}
    elif rc == "selective":
        ac = {"mode": "selective", "selective_ac_option": "op"}
    elif isinstance(rc, dict):
        n = _every_nth([rc[b] for b in names])
        ac = {"mode": "selective", "selective_ac_option": str(n)}
    model, note = model_section(facts.get("arch"), facts.get("arch_why"))
    lines = [f"# {h}" for h in header] + ([f"# NOTE: {note}"] if note else [])
    if ecfg.runtime in (_ERA, _ERA_COMPILE):
        lines.append(f"# NOTE: priced on torchtitan's Dec 2024 stack ({ecfg.runtime}); sapp reads this file, "
                     f"0.2.2's schema, as a current stack ({RUNTIME})")
    if ecfg.fp8:                # torchao's tensorwise Float8Linear on the blocks' linears (engines/fp8.py)
        model = {**(model or {}), "converters": [fp8.TT_NAME]}
    sections = [("model", model)] if model else []
    for sec, body in sections + [("parallelism", par), ("training", train), ("activation_checkpoint", ac),
                      ("compile", _compile_section(ecfg.runtime))] + fp8.torchtitan_sections(ecfg.fp8):
        lines.append(f"[{sec}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in body.items()]
        lines.append("")
    return "\n".join(lines)


def _compile_section(runtime) -> dict:
    """[compile] of a plan priced under `runtime`: the blocks compiled under a "+compile" profile (the loss,
    which 0.2.2 compiles too by default, is priced eager: left out)."""
    return {"enable": True, "components": ["model"]} if runtime.endswith("+compile") else {"enable": False}


def _compiled(comp) -> bool:
    """[compile] enable with "model" among its components (0.2.2's default: model and loss)."""
    parts = comp.get("components", ["model", "loss"])
    return comp.get("enable") is True and isinstance(parts, list) and "model" in parts


# ---- import ----------------------------------------------------------------------------------------
def parse(text: str, facts: dict, devices: int) -> EngineConfig:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise EngineError(f"not a TOML file ({e})") from None
    runtime, era_notes, tp_float8 = RUNTIME, [], False
    if is_2506(doc):            # torchtitan's schema of mid-2025 (its June 2025 benchmark): likewise
        doc, runtime, era_notes, tp_float8 = translate_2506(doc)
    elif is_era(doc):           # torchtitan's schema of before 2025-02: its fields choose the profile
        doc, runtime, era_notes = translate(doc)
    from .torchtitan_fields import check
    check(doc)
    _check_model(doc.get("model") or {}, facts)
    par, train = doc.get("parallelism") or {}, doc.get("training") or {}
    ac, comp = doc.get("activation_checkpoint") or {}, doc.get("compile") or {}
    L = facts["layers"]
    notes = []
    num = _whole
    tp, pp, cp, ep, rep, shard = _degrees(par, devices)
    dp = rep * shard
    reshard = par.get("fsdp_reshard_after_forward", "default")
    if shard > 1 or cp > 1:
        zero = {"never": 2, "always": 3}.get(reshard, 2 if pp > 1 else 3)
    else:
        zero = 0
    if facts.get("seq") and train.get("seq_len", facts["seq"]) != facts["seq"]:
        raise EngineError(f"training.seq_len {train['seq_len']} but the model has {facts['seq']}; pass the --model "
                          f"this file trains")
    local = num(train, "local_batch_size", 8)
    gb = num(train, "global_batch_size", -1)
    gb = local * dp if gb == -1 else gb
    if gb % (local * dp):
        raise EngineError(f"training.global_batch_size {gb} is not a multiple of local_batch_size x data-parallel "
                          f"degree = {local} x {dp}")
    ecfg = EngineConfig(engine=NAME, global_batch=gb, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, sp=tp > 1, zero=zero,
                        runtime=RUNTIME, rep=rep if shard > 1 else 1,
                        precision="fp32" if train.get("mixed_precision_param") == "float32" else "bf16-mixed",
                        optimizer=_optimizer(train))
    if pp > 1:
        if gb != local * dp:
            raise EngineError("sapp prices one pipeline schedule per step: set training.global_batch_size = "
                              "local_batch_size x data-parallel degree (no gradient accumulation around the pipeline)")
        mbs = num(par, "pipeline_parallel_microbatch_size", 1)
        if local % mbs:
            raise EngineError(f"local_batch_size {local} is not a multiple of pipeline_parallel_microbatch_size {mbs}")
        ecfg.mbs, ecfg.m = mbs, local // mbs
        sched = par.get("pipeline_parallel_schedule", "1F1B")
        names = {v: k for k, v in SCHEDULES.items()}
        if sched not in names:
            raise EngineError(f"pipeline_parallel_schedule {sched!r} is not priced by sapp; use one of "
                              f"{', '.join(SCHEDULES.values())}")
        ecfg.schedule = names[sched]
        _stages(par, ecfg, L, num)
    else:
        ecfg.mbs, ecfg.m = local, gb // (local * dp)
    ecfg.recompute = _recompute(ac, facts["names"], notes)
    ecfg.fp8 = fp8.torchtitan_read(doc)
    if tp_float8 and ecfg.fp8 and tp > 1:      # float8 all-gathers under tp (engines/torchtitan_2506.py)
        ecfg.fp8 = fp8.TT_TP_RECIPE
    ecfg.runtime = RUNTIME_COMPILE if runtime == RUNTIME and _compiled(comp) else runtime
    _run_notes(ecfg, train, par, comp, zero, pp, notes)
    ecfg.notes = era_notes + notes
    return ecfg


def _whole(sec, key, default):
    v = sec.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise EngineError(f"{key} must be a whole number, got {v!r}")
    return v


def _degrees(par, devices):
    """(tp, pp, cp, ep, replicate, shard) of the [parallelism] section on `devices` GPUs
    (data_parallel_shard_degree -1: the rest); EngineError for what torchtitan or sapp does not run."""
    num = _whole
    tp, pp = num(par, "tensor_parallel_degree", 1), num(par, "pipeline_parallel_degree", 1)
    cp, ep = num(par, "context_parallel_degree", 1), num(par, "expert_parallel_degree", 1)
    rep, shard = num(par, "data_parallel_replicate_degree", 1), num(par, "data_parallel_shard_degree", -1)
    if min(tp, pp, cp, ep, rep) < 1:
        raise EngineError("parallel degrees must be at least 1 (data_parallel_shard_degree may be -1)")
    if devices % (tp * pp * cp * rep):
        raise EngineError(f"the degrees do not divide the cluster's {devices} GPUs; pass the --cluster this file ran on")
    if shard == -1:
        shard = devices // (tp * pp * cp * rep)
    if rep * shard * tp * pp * cp != devices:
        raise EngineError(f"replicate x shard x tp x pp x cp = {rep * shard * tp * pp * cp}, not the cluster's {devices} GPUs")
    if rep > 1 and shard > 1 and ep > 1:
        raise EngineError("HSDP (data_parallel_replicate_degree and data_parallel_shard_degree both > 1) beside expert "
                          "parallelism is not priced by sapp; use one of them")
    if rep > 1 and shard == 1 and (tp, pp, cp, ep) != (1, 1, 1, 1):
        raise EngineError("torchtitan runs DDP (data_parallel_replicate_degree > 1) only as the one parallelism; "
                          "shard instead (data_parallel_shard_degree)")
    if ep > 1 and tp > 1:
        raise EngineError("expert parallelism beside tensor parallelism is not priced by sapp; use tp 1 with ep")
    return tp, pp, cp, ep, rep, shard


def _run_notes(ecfg, train, par, comp, zero, pp, notes):
    """What the file runs beside the priced step (compile, the reduce width, DDP, accumulation, async TP)."""
    if _compiled(comp):
        notes.append("torch.compile is on in this file (each TransformerBlock): the float8 casts priced compiled "
                     "(costmodel/fp8.py); the loss and the point-wise chains compile fuses (SwiGLU, rotary, "
                     "residual adds) priced as eager kernels, so the step may run faster than priced")
    elif comp.get("enable"):
        notes.append("torch.compile is on in this file for the loss only: priced as eager torch")
    if train.get("mixed_precision_reduce", "float32") != "float32":
        raise EngineError(f"training.mixed_precision_reduce {train['mixed_precision_reduce']!r}: torchtitan 0.2.2 "
                          f"accepts only \"float32\"")
    if zero == 0 and ecfg.precision != "fp32":
        notes.append("torchtitan's DDP trains under torch.autocast over fp32 weights: priced with FSDP2's bf16 "
                     "activation widths, fp32 gradients all-reduced")
    if ecfg.m > 1 and zero > 0 and pp == 1:
        notes.append(f"torchtitan's FSDP2 reduce-scatters the gradients after each of the {ecfg.m} accumulation "
                     f"steps; priced as one reduce-scatter per step (the other {ecfg.m - 1} are not priced)")
    if par.get("enable_async_tensor_parallel"):
        notes.append("async tensor parallelism is on in this file: priced without it")


def _optimizer(train) -> str:
    """training.dtype: "float32" (fp32 master weights under mixed precision: Adam's 12 bytes a parameter) or
    "bfloat16" (pure bf16: the model built in bf16, its gradients and AdamW's moments in bf16, no master:
    priced as the "adam-bf16" optimizer's 4 bytes a parameter beside the 2 + 2 of weights and gradients)."""
    dtype = train.get("dtype", "float32")
    if dtype not in ("float32", "bfloat16"):
        raise EngineError(f"training.dtype {str(dtype)[:40]!r}: torchtitan takes \"float32\" or \"bfloat16\"")
    if dtype == "bfloat16" and train.get("mixed_precision_param") == "float32":
        raise EngineError("training.dtype \"bfloat16\" with mixed_precision_param \"float32\": a bf16 model run in "
                          "fp32 is not priced by sapp; set mixed_precision_param = \"bfloat16\"")
    return PURE_BF16 if dtype == "bfloat16" else "adam"


def _check_model(model, facts):
    """The [model] a file trains against the --model it is priced as: a flavor of another size was priced as
    the --model without a word (0.3's model_registry refuses the same disagreement)."""
    name, flavor, arch = model.get("name", "llama3"), model.get("flavor"), facts.get("arch")
    if flavor is None:
        return
    if name != "llama3" or flavor not in FLAVORS:
        raise EngineError(f"[model] name = {str(name)[:40]!r}, flavor = {str(flavor)[:40]!r}: sapp prices "
                          f"torchtitan's llama3 flavors {', '.join(FLAVORS)}; set one of them")
    if arch is not None:
        have = (model_section(arch)[0] or {}).get("flavor")
        if have != flavor:
            raise EngineError(f"[model] flavor = {flavor!r} builds another model than the --model given "
                              f"({have or 'no llama3 flavor'}); pass the --model this file trains")


def _stages(par, ecfg, L, num):
    pp = ecfg.pp
    fl, ll = num(par, "pipeline_parallel_first_stage_less_layers", 1), num(par, "pipeline_parallel_last_stage_less_layers", 1)
    explicit = par.get("module_fqns_per_model_part")
    if explicit:
        if not isinstance(explicit, list) or not all(isinstance(p, list) for p in explicit):
            raise EngineError("module_fqns_per_model_part must be a list of lists of module names")
        ch = [sum(1 for m in part if isinstance(m, str) and m.startswith("layers.")) for part in explicit]
        n = len(ch)
    else:
        lps = par.get("pipeline_parallel_layers_per_stage")
        if lps is not None:
            n = math.ceil((L + fl + ll) / lps)
        else:
            n = pp * (1 if ecfg.schedule not in ("interleaved", "dualpipev") else 2)
        ch = stage_layers(L, n, fl, ll)
        if ch is None:
            raise EngineError(f"{L} layers do not split into {n} pipeline stages with these weights")
    if n % pp:
        raise EngineError(f"{n} virtual stages are not a multiple of pipeline_parallel_degree {pp}")
    v = n // pp
    if (v > 1) != (ecfg.schedule in ("interleaved", "dualpipev")) or (ecfg.schedule == "dualpipev" and v != 2):
        raise EngineError(f"{v} stage(s) per rank does not fit the {ecfg.schedule} schedule"
                          + (" (DualPipeV runs 2, in a V)" if ecfg.schedule == "dualpipev" else ""))
    ecfg.v = v
    ecfg.chunk_blocks = ch if v > 1 else None
    # rank i runs stages i + c pp (looped), or i and 2 pp - 1 - i (DualPipeV's V)
    ecfg.device_blocks = [sum(ch[rank_stage] for rank_stage in _rank_stages(ecfg.schedule, pp, v, i)) for i in range(pp)]


def _rank_stages(schedule, pp, v, i):
    """The stages pipeline rank i runs, as torchtitan 0.2.2's pipeline_module_split places them."""
    return (i, 2 * pp - 1 - i) if schedule == "dualpipev" else tuple(c * pp + i for c in range(v))


def _recompute(ac, names, notes):
    mode = ac.get("mode", "selective")
    if mode == "none":
        return "none"
    if mode == "full":
        return "full"
    if mode != "selective":
        raise EngineError(f"activation_checkpoint.mode {mode!r} is not priced by sapp; use none, full or selective")
    opt = str(ac.get("selective_ac_option", "2"))
    if opt == "op":
        # priced as torchtitan's op-level policy by the "torchtitan" runtime (sapp/recompute/op_sac.py)
        return "selective"
    try:
        n = int(opt)
    except ValueError:
        raise EngineError(f"selective_ac_option {opt!r}: use 'op' or a whole number") from None
    if n <= 0:
        raise EngineError(f"selective_ac_option {opt!r}: use 'op' or a positive whole number")
    if n == 1:
        return "full"
    return {b: ("full" if (i + 1) % n == 0 else "none") for i, b in enumerate(names)}
