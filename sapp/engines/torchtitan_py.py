"""torchtitan 0.3 (the current release): a plan written as a typed Python job configuration — one
function returning `Trainer.Config(...)` of constructor calls with literal values — and such a file
read back with `ast`, never executed (sapp/engines/pyconfig.py).  `--to torchtitan@0.2.2` keeps the
TOML of the last release that reads one (sapp/engines/torchtitan.py, whose layout rules this reuses).

Launch: save the export as e.g. `sapp_job.py` on the Python path and run
`torchrun --nproc_per_node N -m torchtitan.train --module sapp_job --config sapp_job`
(torchtitan's ConfigManager imports `--module` and calls the `--config` function).

What 0.3 runs, and how it differs from 0.2.2 (torchtitan/config/configs.py, trainer.py,
distributed/activation_checkpoint.py, models/llama3/parallelize.py at 0.3.0):
- activation checkpointing is a typed config: `SelectiveAC.Config()` (the op-level policy, priced as
  "selective"), `FullAC.Config()`, or `None`; there is no mode string and no every-N-th-layer option,
  so a per-block mix is exported as one policy on every layer, with a note;
- tensor parallelism states sequence parallelism (`enable_sequence_parallel`, on by default): it is
  written as priced, and read as written;
- data parallelism is always FSDP2 (`apply_fsdp_to_decoder`): data_parallel_replicate_degree alone is
  FSDP2 over a replicate mesh (ZeRO-0 as sapp prices it, beside any other parallelism); replicate and
  shard together are HSDP, priced as torchtitan.py says;
- the forward+backward is captured as a CUDA graph unless `disable_cuda_graphs` (torchtitan refuses it
  with pipeline parallelism); sapp prices eager kernels, each at least its launch, so an export disables
  the graphs and an import with them on says it may run faster;
- the attention kernel is `model_registry(flavor, attn_backend=...)` (models/common/config_utils.py
  get_attention_config; SDPA is gone for language models): "flex" (the default: FlexAttention),
  "flex_flash" (its flash backend) or "varlen" (torch's varlen_attn: FlashAttention, FA3 on Hopper,
  FA2 before; torchtitan's own varlen job turns CUDA graphs off, as varlen reads its document lengths on
  the host).  An export writes "varlen", which the "torchtitan" runtime prices at the cluster's
  FlashAttention figures (`flash_attention_efficiency`: FlashAttention-3's paper on the Hopper
  presets); an import of "flex" or "flex_flash" is priced at the same figures and says so
  (FlexAttention's own speed is not measured here).  Every backend masks block-causally by document,
  which sapp prices as one document a sequence (an upper bound);
- model_registry's other arguments: `converters` (float8 / MX / NVFP4 linear layers) are refused in one
  line (0.3's Float8LinearConverter scales rowwise only, which sapp does not price: an FP8 plan goes to
  torchtitan@0.2.2's tensorwise converter, sapp/engines/fp8.py), `tp_gemm_backend="dist_gemm"`
  (collectives folded into GEMMs over symmetric memory) too under
  tensor parallelism (without it torchtitan runs the stock projections);
- the batch fields are 0.3.0's (local_batch_size, global_batch_size, seq_len,
  pipeline_parallel_microbatch_size); torchtitan main's token counts (num_tokens_per_microbatch_per_dp_rank,
  num_tokens_per_train_step, max_context_length, num_pp_microbatches) are read too."""
from __future__ import annotations

from ..errors import shown
from . import torchtitan as v022
from .arch_hf import torchtitan_attention_agrees
from .mapping import EngineConfig, EngineError
from .pyconfig import Call, parse as parse_python, read
from .torchtitan_py_fields import CLASSES, check

NAME = "torchtitan"
RUNTIME = "torchtitan"      # torchtitan 0.3 as exported: varlen FlashAttention (costmodel/torchtitan.py)
SCHEDULES = v022.SCHEDULES
# torchtitan 0.3's llama3 flavors (models/llama3/__init__.py): (layers, hidden, heads, kv heads, ffn, tied)
FLAVORS = {"1B": (16, 2048, 32, 8, 8192, True), "3B": (28, 3072, 24, 8, 8192, True),
           **{k: (*v, False) for k, v in v022.FLAVORS.items()}}
FUNCTION = "sapp_job"
# model_registry's keyword arguments in 0.3.0 (models/llama3/__init__.py) and what each may be
ATTN_BACKENDS = ("flex", "flex_flash", "varlen")
REGISTRY_ARGS = ("attn_backend", "tp_gemm_backend", "converters")
VARLEN_NOTE = ("attention runs FlashAttention (attn_backend='varlen': FA3 on Hopper, FA2 before), block-causal by "
               "document, priced as one document a sequence at the cluster's FlashAttention figures")


def _flavor(arch):
    """torchtitan's llama3 flavor of this architecture, or None."""
    if arch is None:
        return None
    llama = (arch["norm"] == "RMSNorm" and arch["glu"] and arch["position"] == "rope" and not arch["bias"]
             and not arch["qkv_bias"] and not arch.get("experts") and arch["vocab"] == 128256
             and arch["head_dim"] * arch["heads"] == arch["hidden"] and arch.get("rope_base") == 500000
             and torchtitan_attention_agrees(arch))
    shape = (arch["layers"], arch["hidden"], arch["heads"], arch["kv_heads"], arch["ffn"], bool(arch["tied"]))
    return next((f for f, s in FLAVORS.items() if llama and s == shape), None)


# ---- export ----------------------------------------------------------------------------------------
def conform(ecfg: EngineConfig, names) -> tuple:
    notes = []
    out = ecfg.replace()
    if out.zero == 1:
        raise EngineError("torchtitan shards with FSDP2 (ZeRO-2/3) or replicates; the plan uses ZeRO-1: search again "
                          "with --target torchtitan")
    if out.offload_optimizer:
        raise EngineError("the plan offloads the optimizer only, which torchtitan cannot state (its CPU offload moves "
                          "parameters too); search again with --target torchtitan")
    if out.zero == 0 and out.cp > 1:
        notes.append("torchtitan's FSDP2 shards the parameters over the context-parallel ranks: ZeRO-0 exported as "
                     "ZeRO-2 (fsdp_reshard_after_forward never)")
        out.zero = 2
    if out.runtime != RUNTIME:
        notes.append(v022.retarget_note(out.runtime, RUNTIME))
        out.runtime = RUNTIME
    rc = out.recompute
    if not isinstance(rc, str):
        kinds = {rc[b] for b in names}
        new = kinds.pop() if len(kinds) == 1 else ("full" if "full" in kinds else "selective")
        if len(kinds):
            notes.append(f"torchtitan 0.3 checkpoints every layer one way: per-block recomputation exported as {new} "
                         f"on every layer")
        out.recompute = new
    return out, notes


def _py(v) -> str:
    if isinstance(v, Call):
        inner = ", ".join([_py(a) for a in v.args] + [f"{k}={_py(x)}" for k, x in v.kwargs.items()])
        return f"{v.name}({inner})"
    if isinstance(v, list):
        return "[" + ", ".join(_py(x) for x in v) + "]"
    if isinstance(v, tuple):
        return "(" + ", ".join(_py(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(x)}" for k, x in v.items()) + "}"
    return repr(v)


def _layout(ecfg, L) -> dict:
    par = {"pipeline_parallel_schedule": SCHEDULES[ecfg.schedule], "pipeline_parallel_microbatch_size": ecfg.mbs}
    lps, fl, ll, explicit = v022._layout_for(ecfg, L)
    par.update(pipeline_parallel_first_stage_less_layers=fl, pipeline_parallel_last_stage_less_layers=ll)
    if lps is not None:
        par["pipeline_parallel_layers_per_stage"] = lps
    if explicit is not None:
        parts, pos = [], 0
        for j, k in enumerate(explicit):
            parts.append((["tok_embeddings"] if j == 0 else []) + [f"layers.{pos + q}" for q in range(k)]
                         + (["norm", "output"] if j == len(explicit) - 1 else []))
            pos += k
        par["module_fqns_per_model_part"] = parts
    return par


def export(ecfg: EngineConfig, facts: dict, names, header=()) -> str:
    L = len(names)
    par = {"data_parallel_replicate_degree": ecfg.dp if ecfg.zero == 0 else ecfg.rep,
           "data_parallel_shard_degree": 1 if ecfg.zero == 0 else ecfg.dp // ecfg.rep}
    if ecfg.zero:
        par["fsdp_reshard_after_forward"] = "never" if ecfg.zero == 2 else "always"
    par.update(tensor_parallel_degree=ecfg.tp, enable_sequence_parallel=bool(ecfg.sp and ecfg.tp > 1),
               pipeline_parallel_degree=ecfg.pp, context_parallel_degree=ecfg.cp, expert_parallel_degree=ecfg.ep)
    train = {"global_batch_size": ecfg.global_batch,
             "local_batch_size": ecfg.global_batch // ecfg.dp if ecfg.pp > 1 else ecfg.mbs}
    if facts.get("seq"):
        train["seq_len"] = facts["seq"]
    train["mixed_precision_param"] = "bfloat16" if ecfg.precision != "fp32" else "float32"
    train["mixed_precision_reduce"] = "float32"
    if ecfg.optimizer == v022.PURE_BF16:        # pure bf16 training: no fp32 master weights
        train["dtype"] = "bfloat16"
    if ecfg.pp > 1:
        par.update(_layout(ecfg, L))
    # eager kernels as priced (and varlen attention reads its document lengths on the host)
    train["disable_cuda_graphs"] = True
    ac = {"none": None, "full": Call("FullAC.Config"), "selective": Call("SelectiveAC.Config")}[ecfg.recompute]
    arch = facts.get("arch")
    flavor = _flavor(arch)
    notes = [VARLEN_NOTE]
    body = {}
    if flavor:
        body["model_spec"] = Call("model_registry", [flavor], {"attn_backend": "varlen"})
    else:
        what = v022.model_section(arch, facts.get("arch_why"))[1].split(" (", 1)[1].split("):", 1)[0]
        notes.insert(0, f"this model is none of torchtitan's llama3 flavors ({what}): the file names no model_spec, so "
                        f"torchtitan refuses it until you add the model_registry(..., attn_backend='varlen') of the "
                        f"architecture priced")
    body.update(
        parallelism=Call("ParallelismConfig", kwargs=par), training=Call("TrainingConfig", kwargs=train),
        activation_checkpoint=ac, compile=Call("CompileConfig", kwargs={"enable": False}),
        optimizer=Call("OptimizersContainer.Config", kwargs={"param_groups": [Call("ParamGroupConfig", kwargs={
            "pattern": ".*", "optimizer_name": "AdamW",
            "optimizer_kwargs": {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}})]}))
    if arch and arch.get("vocab"):
        body["loss"] = Call("CrossEntropyLoss.Config", kwargs={"global_vocab_size": arch["vocab"]})
    lines = [f"# {h}" for h in header] + [f"# NOTE: {n}" for n in notes] + [
        f"# run: save as {FUNCTION}.py on the Python path, then",
        f"#   torchrun --nproc_per_node <GPUs per node> -m torchtitan.train --module {FUNCTION} --config {FUNCTION}",
        "# (add your dataloader=HuggingFaceTextDataLoader.Config(dataset=...) and checkpoint settings: not priced)",
        "from torchtitan.components.loss import CrossEntropyLoss",
        "from torchtitan.components.optimizer import OptimizersContainer",
        "from torchtitan.components.optimizer.optimizer import ParamGroupConfig",
        "from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
        "from torchtitan.models.llama3 import model_registry",
        "from torchtitan.trainer import Trainer", "", "",
        f"def {FUNCTION}() -> Trainer.Config:", "    return Trainer.Config("]
    for k, v in body.items():
        if isinstance(v, Call) and v.kwargs and k in ("parallelism", "training"):
            lines.append(f"        {k}={v.name}(")
            lines += [f"            {a}={_py(x)}," for a, x in v.kwargs.items()]
            lines.append("        ),")
        else:
            lines.append(f"        {k}={_py(v)},")
    lines.append("    )")
    return "\n".join(lines) + "\n"


# ---- import ----------------------------------------------------------------------------------------
def _sections(root: Call) -> dict:
    """{section: {field: value}} of the Trainer.Config call, each field checked against the 0.3 table;
    `activation_checkpoint` becomes {"class": name or None, ...}."""
    if root.name != "Trainer.Config" or root.args:
        raise EngineError(f"line {root.line}: the function returns {root.name}(...), not Trainer.Config(keyword=...)")
    doc = {"trainer": {}}
    for sec, v in root.kwargs.items():
        if sec == "model_spec" or not isinstance(v, Call) and sec not in CLASSES:
            check("trainer", sec, v)
            doc["trainer"][sec] = v
            continue
        if sec not in CLASSES:
            raise EngineError(f"Trainer.Config has no section {shown(sec)} in torchtitan 0.3; remove it")
        if v is None and sec == "activation_checkpoint":
            doc[sec] = {"class": None}
            continue
        if sec == "optimizer" and isinstance(v, Call) and v.name == "default_adamw":
            doc[sec] = {"param_groups": [Call("ParamGroupConfig", kwargs={"optimizer_name": "AdamW"})]}
            continue
        if not isinstance(v, Call) or v.args or (v.name and v.name not in CLASSES[sec]):
            shown = v.name if isinstance(v, Call) else repr(v)[:40]
            raise EngineError(f"{sec} = {shown}: sapp reads {' or '.join(CLASSES[sec])}(keyword=...) here")
        body = {"class": v.name or CLASSES[sec][0]}
        for k, x in v.kwargs.items():
            check(sec, k, x)
            body[k] = x
        doc[sec] = body
    return doc


def _model(doc, facts) -> dict:
    """model_registry's keyword arguments (their defaults filled in), each checked; {} without a model_spec."""
    spec = doc["trainer"].get("model_spec")
    if spec is None:
        return {}
    if not isinstance(spec, Call) or spec.name != "model_registry":
        raise EngineError("model_spec: sapp reads model_registry(\"<flavor>\", keyword=...) of torchtitan.models.llama3")
    params = ("flavor",) + REGISTRY_ARGS            # model_registry's signature, in order
    if len(spec.args) > len(params):
        raise EngineError(f"model_registry takes {len(params)} arguments ({', '.join(params)}), "
                          f"got {len(spec.args)} positional ones")
    bound = dict(zip(params, spec.args))
    for k, v in spec.kwargs.items():
        if k not in params:
            raise EngineError(f"model_registry({k}=...): torchtitan 0.3's llama3 model_registry takes no {k!r} "
                              f"(it takes {', '.join(params)}); remove it")
        if k in bound:
            raise EngineError(f"model_registry: {k} is given twice; pass it once")
        bound[k] = v
    if "flavor" not in bound:
        raise EngineError("model_spec: model_registry(...) names no flavor; pass one of " + ", ".join(FLAVORS))
    flavor, arch = bound.pop("flavor"), facts.get("arch")
    if flavor not in FLAVORS:
        raise EngineError(f"model_registry({str(flavor)[:40]!r}): sapp prices torchtitan's llama3 flavors "
                          f"{', '.join(FLAVORS)}; pass one of them")
    if arch is not None and _flavor(arch) != flavor:
        raise EngineError(f"model_registry({shown(flavor)}) builds another model than the --model given "
                          f"({_flavor(arch) or 'no llama3 flavor'}); pass the --model this file trains")
    args = {"attn_backend": "flex", "tp_gemm_backend": "default", "converters": None, **bound}
    if args["attn_backend"] not in ATTN_BACKENDS:
        raise EngineError(f"model_registry(attn_backend={str(args['attn_backend'])[:40]!r}): torchtitan 0.3 runs a "
                          f"language model's attention as {', '.join(map(repr, ATTN_BACKENDS))}; pass one of them")
    if args["tp_gemm_backend"] not in ("default", "dist_gemm"):
        raise EngineError(f"model_registry(tp_gemm_backend={str(args['tp_gemm_backend'])[:40]!r}): torchtitan 0.3 "
                          f"takes 'default' or 'dist_gemm'")
    conv = args["converters"]
    if conv not in (None, []):
        names = ", ".join(c.name if isinstance(c, Call) else repr(c)[:40] for c in (conv if isinstance(conv, list)
                                                                                  else [conv]))
        if "Float8LinearConverter" in names:     # 0.3.0 has no tensorwise recipe (sapp/engines/fp8.py)
            raise EngineError(f"model_registry(converters=[{names}]): torchtitan 0.3's Float8LinearConverter scales "
                              f"rowwise only, which sapp does not price; remove converters to price the bf16 job")
        raise EngineError(f"model_registry(converters=[{names}]): sapp does not price MX / NVFP4 linear layers or "
                          f"float8 grouped experts; remove converters to price the bf16 job")
    return args


def _kernel_notes(args, train, tp) -> list:
    """The attention kernel and CUDA graphs of an imported job: refused where torchtitan cannot run them,
    said where sapp prices them otherwise than they run (module docstring)."""
    graphs = not train.get("disable_cuda_graphs", False)
    attn = args.get("attn_backend", "flex")
    if attn == "varlen" and graphs:
        raise EngineError("attn_backend='varlen' with CUDA graphs: varlen attention reads its document lengths on the "
                          "host, which a captured graph cannot (torchtitan's own varlen job turns them off); set "
                          "TrainingConfig(disable_cuda_graphs=True)")
    if args.get("tp_gemm_backend") == "dist_gemm" and tp > 1:
        raise EngineError("model_registry(tp_gemm_backend='dist_gemm'): sapp does not price tensor-parallel collectives "
                          "folded into their GEMMs over symmetric memory; use 'default' to price the rest")
    notes = []
    if attn == "varlen":
        notes.append(VARLEN_NOTE)
    else:
        notes.append(f"attention runs FlexAttention (attn_backend={attn!r}{', the default' if attn == 'flex' else ''}), "
                     f"priced as the FlashAttention kernel attn_backend='varlen' runs (the cluster's figures for "
                     f"it): FlexAttention's own speed is not measured here")
    if graphs:
        notes.append("the forward+backward replays as a CUDA graph: priced as eager kernels, each at least its "
                     "launch, so torchtitan may run faster than priced where kernels are short")
    return notes


def _optimizer(doc):
    for g in (doc.get("optimizer") or {}).get("param_groups") or []:
        name = g.kwargs.get("optimizer_name") if isinstance(g, Call) and g.name == "ParamGroupConfig" else None
        if isinstance(g, Call):
            for k, v in g.kwargs.items():
                check("param_group", k, v)
        if name not in ("AdamW", "Adam"):
            raise EngineError(f"optimizer param group {str(name or g)[:60]!r}: sapp prices Adam's two states "
                              f"(AdamW / Adam)")


def _batch(train, par, pp, notes) -> dict:
    """torchtitan main's token counts as 0.3.0's batch fields (same meaning, in samples)."""
    new = [k for k in ("num_tokens_per_microbatch_per_dp_rank", "num_tokens_per_train_step", "max_context_length")
           if k in train] + [k for k in ("num_pp_microbatches",) if k in par]
    if not new:
        return train
    old = [k for k in ("local_batch_size", "global_batch_size", "seq_len") if k in train]
    if old or "pipeline_parallel_microbatch_size" in par:
        raise EngineError(f"the file mixes torchtitan main's {new[0]} with 0.3.0's "
                          f"{(old or ['pipeline_parallel_microbatch_size'])[0]}; use one release's names")
    seq = train.get("max_context_length", 2048)
    tok = train.get("num_tokens_per_microbatch_per_dp_rank", 16384)
    m = par.get("num_pp_microbatches", 1) if pp > 1 else 1
    for k, v in (("max_context_length", seq), ("num_tokens_per_microbatch_per_dp_rank", tok),
                 ("num_pp_microbatches", m)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise EngineError(f"{k} must be a whole number >= 1, got {shown(v)}")
    if tok % seq:
        raise EngineError(f"num_tokens_per_microbatch_per_dp_rank {tok} is not a whole number of max_context_length "
                          f"{seq} sequences; sapp prices whole sequences")
    out = {k: v for k, v in train.items() if k not in new}
    out.update(seq_len=seq, local_batch_size=tok // seq * m)
    par["pipeline_parallel_microbatch_size"] = tok // seq
    step = train.get("num_tokens_per_train_step", -1)
    if step != -1:
        if isinstance(step, bool) or not isinstance(step, int) or step < 1 or step % seq:
            raise EngineError(f"num_tokens_per_train_step {shown(step)} is not a whole number of {seq}-token sequences")
        out["global_batch_size"] = step // seq
    notes.append("read torchtitan main's token-count batch fields as samples of max_context_length tokens")
    return out


def is_toml(text: str) -> bool:
    """A torchtitan 0.2.2 TOML given as `--from torchtitan`: TOML, and not a Python file with a function.
    TOML first: a Python job fails it on its first statement, so the file is parsed as Python once, by
    `read` (the Python test came first once, and a 4 MB file was parsed twice, issue 53)."""
    import ast
    import tomllib
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return False
    try:         # TOML that is also Python with a function (hardly a file at all): Python
        return not any(isinstance(st, ast.FunctionDef) for st in parse_python(text).body)
    except EngineError:
        return True


def parse(text: str, facts: dict, devices: int, job: str | None = None) -> EngineConfig:
    """The job configuration `text`; `job`: the job function of a file of several (a registry file such
    as 0.3.0's models/llama3/config_registry.py, read as published), as torchtitan's --config names it."""
    if is_toml(text):         # read as 0.2.2's TOML, said so; priced as that release runs it
        if job is not None:
            raise EngineError(f"--job {shown(job)} picks a job function of a torchtitan 0.3 Python file; this is a "
                              f"torchtitan 0.2.2 TOML, which has none")
        ecfg = v022.parse(text, facts, devices)
        which = "torchtitan 0.2.2's job configuration" if ecfg.runtime == v022.RUNTIME else \
            "torchtitan's job TOML of its 2024 schema"          # (said in the next note)
        ecfg.notes = [f"a TOML file: read as {which} (torchtitan 0.3 reads Python; pass --from torchtitan@0.2.2 "
                      "to say so)"] + ecfg.notes
        return ecfg
    root, name, jobs = read(text, job=job)
    if jobs == 1:
        return _parse_job(root, facts, devices)
    try:        # of a registry's several jobs, every refusal names the one read
        ecfg = _parse_job(root, facts, devices)
    except EngineError as e:
        raise EngineError(f"job {name}: {e}") from None
    ecfg.notes.insert(0, f"read job function {name}, one of the file's {jobs}")
    return ecfg


def _parse_job(root: Call, facts: dict, devices: int) -> EngineConfig:
    doc = _sections(root)
    registry = _model(doc, facts)
    _optimizer(doc)
    par, train = dict(doc.get("parallelism") or {}), dict(doc.get("training") or {})
    ac, comp, loss = doc.get("activation_checkpoint") or {"class": "SelectiveAC.Config"}, doc.get("compile") or {}, \
        doc.get("loss") or {}
    notes = []
    pp = par.get("pipeline_parallel_degree", 1)
    train = _batch(train, par, pp, notes)
    sp = par.pop("enable_sequence_parallel", True)
    if not isinstance(sp, bool):
        raise EngineError(f"enable_sequence_parallel must be True or False, got {shown(sp)}")
    if pp not in (None, 1) and not train.get("disable_cuda_graphs", False):
        raise EngineError("torchtitan refuses CUDA graphs with pipeline parallelism: set "
                          "TrainingConfig(disable_cuda_graphs=True)")
    if ac["class"] == "MemoryBudgetAC.Config":
        raise EngineError("activation_checkpoint = MemoryBudgetAC.Config: the compiler's memory-budget partitioner is "
                          "not priced by sapp; use SelectiveAC.Config(), FullAC.Config() or None")
    # the rest reads as 0.2.2's sections (the same field names and meanings)
    toml_ac = {None: {"mode": "none"}, "FullAC.Config": {"mode": "full"},
               "SelectiveAC.Config": {"mode": "selective", "selective_ac_option": "op"}}[ac["class"]]
    ecfg = _v022_parse(par, train, toml_ac, comp, facts, devices)
    tp = ecfg.tp
    ecfg.sp = bool(sp and tp > 1)
    notes += _kernel_notes(registry, train, tp)
    if loss.get("class") == "ChunkedLossWrapper.Config":
        inner = loss.get("loss_fn")
        if inner is not None and not (isinstance(inner, Call) and inner.name == "CrossEntropyLoss.Config"):
            raise EngineError(f"loss_fn = {getattr(inner, 'name', repr(inner))[:40]}: sapp prices cross-entropy "
                              f"(CrossEntropyLoss.Config)")
        chunks = loss.get("num_chunks", 8)
        notes.append(f"the loss runs in {chunks} chunks (ChunkedLossWrapper): priced with whole "
                     f"logits, so torchtitan may hold less memory than priced")
    ecfg.notes = notes + [n for n in ecfg.notes if "DDP" not in n]      # (0.3 has no DDP: FSDP2 replicates)
    return ecfg


def _v022_parse(par, train, ac, comp, facts, devices) -> EngineConfig:
    """0.2.2's reading of the same [parallelism] / [training] / [compile] fields (torchtitan.parse, given
    them as TOML text: data only), with DDP's one-parallelism rule lifted (0.3 replicates with FSDP2
    beside any parallelism)."""
    rep = par.get("data_parallel_replicate_degree", 1)
    lifted = dict(par)
    ddp_beside = rep != 1 and par.get("data_parallel_shard_degree", -1) == 1 and any(
        par.get(k, 1) != 1 for k in ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
                                     "expert_parallel_degree"))
    if ddp_beside:
        lifted.update(data_parallel_replicate_degree=1, data_parallel_shard_degree=rep,
                      fsdp_reshard_after_forward="never")
    lines = []
    for sec, body in (("parallelism", lifted), ("training", train), ("activation_checkpoint", ac), ("compile", comp)):
        lines.append(f"[{sec}]")
        for k, v in body.items():
            if k in ("class", "disable_cuda_graphs") or v is None:
                continue           # (None: the default of the fields that take it)
            if not isinstance(v, (bool, int, str, list)) or isinstance(v, list) and not _plain_list(v) or \
                    isinstance(v, str) and not v.isprintable():
                raise EngineError(f"{sec}.{k} = {str(v)[:40]!r}: not a value sapp reads there")
            lines.append(f"{k} = {v022._toml_value(v)}")
    ecfg = v022.parse("\n".join(lines), facts, devices)
    if ddp_beside:
        ecfg.zero = 0
    ecfg.engine, ecfg.runtime = NAME, RUNTIME
    return ecfg


def _plain_list(v) -> bool:
    return all(isinstance(x, str) and x.isprintable() or isinstance(x, list) and _plain_list(x) for x in v)
