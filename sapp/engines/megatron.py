"""Megatron-LM `pretrain_gpt.py` arguments: a plan written as an argument file, and an argument file
read back as a configuration (tokens only: shlex, never executed; a launch script in the style of
Megatron-LM's examples/*/train_*.sh, with bash arrays and variables, is read as text by megatron_script.py).

The file states the whole model (model_args: sizes, vocabulary unpadded, norm, SwiGLU, positions,
biases, tying, dropout, MoE with the all-to-all dispatcher and grouped GEMM) and the gradients' width
as priced: a plan priced with 2-byte gradients says --grad-reduce-in-bf16, one priced with fp32
main_grads (settings.grad_fp32: what Megatron keeps under --bf16 without that flag) does not; the
environment Megatron-Core asserts (CUDA_DEVICE_MAX_CONNECTIONS=1) is a `# environment:` comment line.
An imported file is priced with the gradients it keeps (fp32 under --bf16 unless --grad-reduce-in-bf16);
one that builds another model is priced with a note saying so.

Runtime: Megatron-Core's fused kernels ("fused"; "fused+tp-overlap" with --tp-comm-overlap).  ZeRO-1
is the distributed optimizer; its gradient reduce-scatter and parameter all-gather overlap as the
fused profile prices them (--overlap-grad-reduce, --overlap-param-gather).  Stages: equal, or the
first / last stage different (--decoder-first/last-pipeline-num-layers), or any partition with at
least one layer a stage (--pipeline-model-parallel-layout); interleaving: equal virtual
stages (--num-layers-per-virtual-pipeline-stage), or Llama 3's layout where the embedding and the
loss count as a layer each (--account-for-embedding/loss-in-pipeline-split).  Recomputation:
selective on every layer, full on every layer, or full on the first N layers of every (virtual)
stage (--recompute-method block --recompute-num-layers N).  FP8 linears: --fp8-format hybrid
--fp8-recipe delayed or --fp8-format e4m3 --fp8-recipe blockwise, Transformer Engine's delayed or block
scaling (sapp/engines/fp8.py).  Every other flag of
Megatron-LM's parser is refused in one line or irrelevant to the step (sapp/engines/megatron_fields.py)."""
from __future__ import annotations

import shlex

from . import fp8, megatron_recompute, megatron_script
from .mapping import EngineConfig, EngineError
from .megatron_fields import FIELDS, MULTI, check, layout_counts
from .megatron_model import ENV, check_arch, model_args, model_notes
from .megatron_overlap import overlap_flags, read_overlap

NAME = "megatron"
RUNTIMES = ("fused", "fused+tp-overlap")

# flags that take no value (the rest take one)
SWITCHES = {"--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
            "--bf16", "--fp16", "--tp-comm-overlap", "--recompute-activations", "--group-query-attention",
            "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
            "--untie-embeddings-and-output-weights", "--use-flash-attn", "--swiglu", "--disable-bias-linear",
            "--use-mcore-models", "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion",
            "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32", "--moe-grouped-gemm", "--add-qkv-bias",
            "--use-rope-scaling", "--moe-shared-expert-gate", "--moe-router-pre-softmax", "--no-fp8-wgrad",
            "--disable-fp8-wgrad", "--first-last-layers-bf16", "--fp8-param-gather", "--moe-layer-recompute",
            "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"}
# every flag of Megatron-LM's parser is priced, refused in one line or irrelevant: megatron_fields.FIELDS


# ---- export ----------------------------------------------------------------------------------------
def conform(ecfg: EngineConfig, names) -> tuple:
    """(configuration Megatron runs, notes on what changed).  Refuses what it cannot state at all."""
    notes = []
    if ecfg.schedule == "dualpipev":
        raise EngineError("Megatron-LM has no DualPipeV schedule (1F1B and interleaved 1F1B only); search again "
                          "with --target megatron")
    if ecfg.zero > 1:
        raise EngineError(f"Megatron's distributed optimizer is ZeRO-1; the plan uses ZeRO-{ecfg.zero}: search again "
                          f"with --target megatron")
    if ecfg.schedule == "gpipe":
        raise EngineError("Megatron has no GPipe schedule; search again with --target megatron")
    if ecfg.offload_optimizer:
        raise EngineError("the plan offloads the optimizer to the host, which Megatron-LM's arguments do not state; "
                          "search again with --target megatron")
    out = ecfg.replace()
    if out.ep > 1 and out.tp > 1 and not out.sp:
        notes.append("Megatron runs expert parallelism beside tensor parallelism with sequence parallelism only: "
                     "exported with --sequence-parallel and re-priced so")
        out.sp = True
    if out.runtime not in RUNTIMES:
        notes.append(f"the plan was priced for the {out.runtime} runtime; Megatron-Core runs fused kernels: "
                     f"re-priced as fused")
        out.runtime = "fused"
    L = len(names)
    # (stages whose middle counts differ are exported as they are, in --pipeline-model-parallel-layout:
    # forcing them to the first / last flags' split moved DeepSeek-V3's layers onto its end stages,
    # 146 GB a device against 77.6 usable, issue 52)
    if out.schedule == "interleaved":
        if not out.chunk_blocks or _interleave_flags(out, L) is None:
            if L % (out.pp * out.v):
                raise EngineError(f"Megatron interleaving needs virtual stages of equal size; {L} layers do not split "
                                  f"into {out.pp} x {out.v}: search again with --target megatron")
            k = L // (out.pp * out.v)
            notes.append(f"Megatron interleaves virtual stages of equal size: chunks {(out.chunk_blocks or [])[:6]}... "
                         f"exported as {k} layers each")
            out.chunk_blocks = [k] * (out.pp * out.v)
            out.device_blocks = [k * out.v] * out.pp
    megatron_recompute.conform(out, names, notes)
    return out, notes


def _interleave_flags(ecfg, L):
    """(layers per virtual stage, account for embedding/loss) that reproduce the chunk sizes, or None."""
    ch = ecfg.chunk_blocks
    k = max(ch)
    if all(c == k for c in ch):
        return k, False
    if ch[0] == k - 1 and ch[-1] == k - 1 and all(c == k for c in ch[1:-1]):
        return k, True
    return None


# Megatron-Core 0.16.1's MoELayer.forward raises in training at tp > 1 without sequence parallelism
MOE_SP = ("sequence parallelism: Megatron-Core's MoE layer raises in training at tensor parallelism > 1 without "
          "--sequence-parallel, which the plan does not price; search again with --target megatron (or --sp)")
NO_ARCH = ("Megatron builds its own GPT model and sapp does not know a factory model's architecture; export to "
           "deepspeed, which trains your own module")


def export(ecfg: EngineConfig, facts: dict, names, header=()) -> str:
    """The argument file's text: one flag (and value) per line, comments first."""
    L = len(names)
    lines = [f"# {h}" for h in header] + [f"# {ENV}"]
    a = []

    def add(flag, value=None):
        a.append(flag if value is None else f"{flag} {value}")

    if facts.get("arch") is None:
        raise EngineError(facts.get("arch_why") or NO_ARCH)
    if facts["arch"].get("experts") and ecfg.tp > 1 and not ecfg.sp:
        raise EngineError(MOE_SP)
    a += model_args(facts["arch"], ecfg.tp)
    add("--tensor-model-parallel-size", ecfg.tp)
    add("--pipeline-model-parallel-size", ecfg.pp)
    if ecfg.cp > 1:
        add("--context-parallel-size", ecfg.cp)
        add("--cp-comm-type", "all_gather")        # keys and values all-gathered: what sapp prices
    if ecfg.ep > 1 or facts["arch"].get("experts"):
        whole = ecfg.etp == 1 and ecfg.tp > 1 and ecfg.ep > 1       # experts whole on ep x tp ranks
        add("--expert-model-parallel-size", ecfg.ep * ecfg.tp if whole else ecfg.ep)
        add("--expert-tensor-parallel-size", ecfg.tp if ecfg.ep > 1 and not whole else 1)   # as costmodel/moe.py prices
    if ecfg.sp:
        add("--sequence-parallel")
    if ecfg.pp > 1 and ecfg.schedule == "interleaved":
        k, account = _interleave_flags(ecfg, L)
        add("--num-layers-per-virtual-pipeline-stage", k)
        if account:
            add("--account-for-embedding-in-pipeline-split")
            add("--account-for-loss-in-pipeline-split")
    elif ecfg.pp > 1 and ecfg.device_blocks and ecfg.pp > 2 and len(set(ecfg.device_blocks[1:-1])) > 1:
        add("--pipeline-model-parallel-layout", layout_text(ecfg.device_blocks))
    elif ecfg.pp > 1 and ecfg.device_blocks and len(set(ecfg.device_blocks)) > 1:
        d = ecfg.device_blocks
        mid = d[1] if ecfg.pp > 2 else None
        if d[0] != mid or ecfg.pp == 2:
            add("--decoder-first-pipeline-num-layers", d[0])
        if d[-1] != mid or ecfg.pp == 2:
            add("--decoder-last-pipeline-num-layers", d[-1])
    a += megatron_recompute.flags(ecfg, names)
    a += overlap_flags(ecfg)
    if ecfg.zero == 1:
        add("--use-distributed-optimizer")
    if ecfg.runtime in RUNTIMES and ecfg.dp * ecfg.cp > 1:
        add("--overlap-grad-reduce")
        if ecfg.zero == 1:
            add("--overlap-param-gather")
    if ecfg.runtime == "fused+tp-overlap":
        add("--tp-comm-overlap")
    add("--micro-batch-size", ecfg.mbs)
    add("--global-batch-size", ecfg.global_batch)
    if ecfg.precision == "bf16-mixed":
        add("--bf16")
        if not ecfg.grad_fp32:            # priced with 2-byte gradients; Megatron keeps fp32 ones otherwise
            add("--grad-reduce-in-bf16")
        a += fp8.megatron_args(ecfg.fp8)  # Transformer Engine's delayed or blockwise scaling, as priced (engines/fp8.py)
    elif ecfg.precision == "fp16-mixed":
        add("--fp16")
        if ecfg.grad_fp32:                # fp16 keeps 2-byte gradients unless told
            add("--accumulate-allreduce-grads-in-fp32")
    return "\n".join(lines + a) + "\n"


def layout_text(device_blocks) -> str:
    """Megatron's --pipeline-model-parallel-layout of one pipeline stage per entry: the embedding E on the
    first, the loss L on the last, a t per decoder layer, | between stages.  Written unrolled, without
    Megatron's (...)*n / x*n repeats, so the value holds no shell glob character where a launcher
    expands the file unquoted (`$(grep -v '^#' file)`)."""
    stages = ["t" * k for k in device_blocks]
    return "E" + "|".join(stages) + "L"


# ---- import ----------------------------------------------------------------------------------------
def tokens(text: str) -> dict:
    """{flag: value or True} from an argument file (shell quoting and # comments; a launcher and the
    script before the first flag are skipped; --flag=value accepted).  Data only: nothing is run."""
    if megatron_script.is_script(text):
        return _script_flags(text)
    try:
        toks = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as e:
        raise EngineError(f"cannot read the argument file ({e}); give Megatron-LM arguments, one flag per line") from None
    # the launcher and its script (`torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers ...`) are
    # skipped up to the first .py that no Megatron flag precedes: a Megatron value may end in .py too
    # (--data-path x.py), and a file of Megatron flags alone has no script (taking the first .py there
    # dropped every flag before it)
    py = None
    for i, t in enumerate(toks):
        if t.split("=", 1)[0] in FIELDS:
            break
        if t.endswith(".py"):
            py = i
            break
    if py is not None:
        toks = toks[py + 1:]
    return _flags(toks)


def _script_flags(text: str) -> dict:
    """{flag: value} a Megatron example shell script launches pretrain_gpt.py with (megatron_script.py):
    every way through it must state the same priced flags; a priced flag whose value reads a variable
    the script never sets is refused in one line naming it."""
    ways = [(_flags(args), why) for _, args, why in megatron_script.launch_args(text)]
    priced = [{k: v for k, v in f.items() if FIELDS.get(k, ("?",))[0] != "irrelevant"} for f, _ in ways]
    if any(p != priced[0] for p in priced[1:]):
        names = sorted({n for _, why in ways for n in why})
        raise EngineError(f"the script's arguments depend on {', '.join('$' + n for n in names) or 'a test'}, which it "
                          f"never sets; set {'it' if len(names) == 1 else 'them'} in the script")
    for k, v in priced[0].items():
        m = megatron_script.UNSET.search(v) if isinstance(v, str) else None
        if m:
            raise EngineError(f"{k} reads ${m.group(1)}, which the script never sets (a positional argument or the "
                              f"environment); set it in the script")
    return ways[0][0]


def _flags(toks) -> dict:
    out, i = {}, 0
    while i < len(toks):
        t = toks[i]
        if not t.startswith("--"):
            raise EngineError(f"unexpected {t!r} in the argument file: every argument is a --flag, with its value "
                              f"after it")
        if "=" in t:
            k, v = t.split("=", 1)
            out[k] = v
        elif t in MULTI:                       # nargs "+" / "*": the values up to the next flag, space-joined
            j = i + 1
            while j < len(toks) and not toks[j].startswith("--"):
                j += 1
            out[t] = " ".join(toks[i + 1:j]) or True
            i = j
            continue
        elif t in SWITCHES or i + 1 >= len(toks) or toks[i + 1].startswith("--"):
            out[t] = True
        else:
            out[t] = toks[i + 1]
            i += 1
        i += 1
    return out


def _int(args, flag, default=None):
    v = args.get(flag, default)
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        raise EngineError(f"{flag} must be a whole number, got {v!r}") from None


def parse(text: str, facts: dict, devices: int) -> EngineConfig:
    """The configuration an argument file runs on `devices` GPUs for a model with `facts`."""
    args = tokens(text)
    check(args)
    L = facts["layers"]
    _check_shape(args, facts)
    check_arch(args, facts.get("arch"))
    tp, pp = _int(args, "--tensor-model-parallel-size", 1), _int(args, "--pipeline-model-parallel-size", 1)
    cp, ep = _int(args, "--context-parallel-size", 1), _int(args, "--expert-model-parallel-size", 1)
    for name, val in (("tensor-model-parallel-size", tp), ("pipeline-model-parallel-size", pp),
                      ("context-parallel-size", cp), ("expert-model-parallel-size", ep)):
        if val < 1:
            raise EngineError(f"--{name} must be at least 1, got {val}")
    if devices % (tp * pp * cp):
        raise EngineError(f"tp x pp x cp = {tp}x{pp}x{cp} does not divide the cluster's {devices} GPUs; "
                          f"pass the --cluster this file ran on")
    dp = devices // (tp * pp * cp)
    mbs = _int(args, "--micro-batch-size", 1)
    gb = _int(args, "--global-batch-size", mbs * dp)
    if gb % (mbs * dp):
        raise EngineError(f"--global-batch-size {gb} is not a multiple of micro-batch size x data-parallel size = "
                          f"{mbs} x {dp}")
    notes = []
    ecfg = EngineConfig(engine=NAME, global_batch=gb, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
                        sp=bool(args.get("--sequence-parallel")), mbs=mbs, m=gb // (mbs * dp),
                        zero=1 if args.get("--use-distributed-optimizer") else 0,
                        precision="bf16-mixed" if args.get("--bf16") else "fp16-mixed" if args.get("--fp16") else "fp32",
                        grad_fp32=_grad_fp32(args),
                        runtime="fused+tp-overlap" if args.get("--tp-comm-overlap") else "fused",
                        fp8=fp8.megatron_read(args))
    if ecfg.sp and tp == 1:
        ecfg.sp = False           # Megatron turns it off itself at tp 1
    etp = _int(args, "--expert-tensor-parallel-size", tp)     # Megatron's default: tp
    if ep > 1:
        ecfg.ep, ecfg.etp = _expert_tp(etp, tp, ecfg.sp, dp, ep)
    elif "--num-experts" in args and tp > 1 and etp != 1:
        # (sapp prices ep 1 with every expert whole on each tp rank: Megatron's etp 1, not its default)
        raise EngineError(f"--expert-tensor-parallel-size {etp} at --expert-model-parallel-size 1 splits each expert "
                          f"over the tp ranks, which sapp prices only beside ep > 1; give --expert-tensor-parallel-size "
                          f"1 (experts whole on every rank) or an --expert-model-parallel-size > 1")
    if "--num-experts" in args and tp > 1 and not ecfg.sp:
        raise EngineError(MOE_SP.replace("the plan does not price; search again with --target megatron (or --sp)",
                                         "this file does not set; add --sequence-parallel"))
    if cp > 1 and args.get("--cp-comm-type", "p2p") != "all_gather":
        notes.append(f"context parallelism priced as keys/values all-gathered (--cp-comm-type all_gather), not "
                     f"{args.get('--cp-comm-type', 'p2p')}")
    _layout(args, ecfg, L)
    ecfg.recompute = megatron_recompute.read(args, ecfg, L, facts["names"], notes)
    read_overlap(args, ecfg)
    if ecfg.dp * ecfg.cp > 1 and not args.get("--overlap-grad-reduce"):
        notes.append("priced with the gradient reduce overlapped with backward as Megatron-Core's "
                     "--overlap-grad-reduce runs it; this file does not set it, so the step may be slower than priced")
    if ecfg.zero == 1 and ecfg.dp * ecfg.cp > 1 and not args.get("--overlap-param-gather"):
        notes.append("priced with the distributed optimizer's parameter all-gather overlapped "
                     "(--overlap-param-gather); this file does not set it")
    notes += model_notes(args, facts.get("arch"), tp, ecfg.precision)
    other = sorted(k for k in args if FIELDS[k][0] == "irrelevant")
    if other:
        notes.append(f"{len(other)} argument(s) do not change the priced step and were not read: "
                     + ", ".join(other[:6]) + (", ..." if len(other) > 6 else ""))
    ecfg.notes = notes
    return ecfg


def _expert_tp(etp, tp, sp, dp, ep) -> tuple:
    """(sapp's ep, etp) of Megatron's --expert-model-parallel-size `ep` and --expert-tensor-parallel-size
    `etp` (default: tp).  sapp prices the experts whole at tp 1; at tp > 1 with sequence parallelism
    (which Megatron requires for MoE beside tp) split over the tp ranks (etp = tp: expert groups of
    tp x ep ranks), or whole (etp 1: Megatron's ep = tp x sapp's ep, the same groups of ranks)."""
    whole = etp == 1 and tp > 1
    if etp != tp and not whole:
        raise EngineError(f"--expert-tensor-parallel-size {etp} with tp {tp}: sapp prices experts split over the tp "
                          f"ranks (expert-tp = tp, Megatron's default) or whole (1); give {tp} or 1")
    if whole and ep % tp:
        raise EngineError(f"--expert-model-parallel-size {ep} with --expert-tensor-parallel-size 1 at tp {tp}: sapp "
                          f"prices expert groups spanning whole tensor-parallel groups; give a multiple of {tp}")
    if whole:
        ep //= tp
    if tp > 1 and not sp:
        raise EngineError("expert parallelism beside tensor parallelism needs --sequence-parallel (Megatron "
                          "asserts it); add it")
    if dp % ep:
        raise EngineError(f"--expert-model-parallel-size {ep * tp if whole else ep} must divide "
                          f"{'tp x ' if whole else ''}the data-parallel size {tp * dp if whole else dp} (expert groups "
                          f"of tp x ep ranks)")
    return ep, 1 if whole else 0


def _grad_fp32(args) -> bool:
    """Megatron's main_grads dtype (validate_args, core_v0.16.1 and main): under --bf16 the DDP buffer and
    its reduce are fp32 unless --grad-reduce-in-bf16; under --fp16 they are fp16 unless
    --accumulate-allreduce-grads-in-fp32 (DistributedDataParallelConfig.grad_reduce_in_fp32)."""
    if args.get("--bf16"):
        return not args.get("--grad-reduce-in-bf16")
    return bool(args.get("--fp16") and args.get("--accumulate-allreduce-grads-in-fp32"))


def _check_shape(args, facts):
    if "--num-layers" not in args:
        raise EngineError("--num-layers is missing; an argument file states the model's layers")
    for flag, key in (("--num-layers", "layers"), ("--hidden-size", "hidden"), ("--num-attention-heads", "heads"),
                      ("--seq-length", "seq"), ("--ffn-hidden-size", "ffn"), ("--num-experts", "experts"),
                      ("--moe-router-topk", "top_k")):
        if flag in args and facts.get(key) is not None and _int(args, flag) != facts[key]:
            raise EngineError(f"{flag} {args[flag]} but the model has {facts[key]}; pass the --model this file trains")
    if "--num-experts" in args and facts.get("expert_ffn") is not None:
        # the experts' width: --moe-ffn-hidden-size, Megatron's default the dense --ffn-hidden-size
        flag = "--moe-ffn-hidden-size" if "--moe-ffn-hidden-size" in args else "--ffn-hidden-size"
        if flag in args and _int(args, flag) != facts["expert_ffn"]:
            raise EngineError(f"{flag} {args[flag]} gives the experts a width of {args[flag]} but the model's have "
                              f"{facts['expert_ffn']}; pass the --model this file trains, or set --moe-ffn-hidden-size")
    if args.get("--group-query-attention") and facts.get("kv_heads") is not None and \
            _int(args, "--num-query-groups", 1) != facts["kv_heads"]:
        raise EngineError(f"--num-query-groups {args.get('--num-query-groups', 1)} but the model has "
                          f"{facts['kv_heads']} key/value heads; pass the --model this file trains")


def _layout(args, ecfg, L):
    pp = ecfg.pp
    if "--pipeline-model-parallel-layout" in args:
        ch = layout_counts(args, pp, L)
        v = len(ch) // pp
        if pp > 1:
            ecfg.schedule, ecfg.v = ("interleaved", v) if v > 1 else ("1f1b", 1)
            ecfg.device_blocks = [sum(ch[c * pp + i] for c in range(v)) for i in range(pp)]
            ecfg.chunk_blocks = ch if v > 1 else None
            if v > 1 and _interleave_flags(ecfg, L) is None:
                raise EngineError(f"--pipeline-model-parallel-layout gives virtual stages of {ch[:8]}"
                                  f"{'...' if len(ch) > 8 else ''} layers; sapp prices interleaving with equal "
                                  f"virtual stages, or Llama 3's with one layer fewer on the first and the last")
        return
    if pp == 1:
        for flag in ("--num-layers-per-virtual-pipeline-stage", "--decoder-first-pipeline-num-layers"):
            if flag in args:
                raise EngineError(f"{flag} needs --pipeline-model-parallel-size > 1")
        return
    account = [bool(args.get("--account-for-embedding-in-pipeline-split")),
               bool(args.get("--account-for-loss-in-pipeline-split"))]
    k, vs = _int(args, "--num-layers-per-virtual-pipeline-stage"), _int(args, "--num-virtual-stages-per-pipeline-rank")
    if k is not None or vs is not None:
        if "--decoder-first-pipeline-num-layers" in args or "--decoder-last-pipeline-num-layers" in args:
            raise EngineError("sapp prices interleaving with virtual stages of equal size: drop "
                              "--decoder-first/last-pipeline-num-layers or the virtual pipeline flag")
        if account[0] != account[1]:
            raise EngineError("sapp prices Llama 3's interleaved layout with both --account-for-embedding- and "
                              "--account-for-loss-in-pipeline-split, or neither")
        total = L + 2 * account[0]
        if k is not None and (k < 1 or total % (pp * k)):
            raise EngineError(f"{total} layers do not split into {pp} stages of virtual stages of {k} layers each "
                              f"(equal size)")
        v = vs if vs is not None else total // (pp * k)
        if v < 1 or total % (pp * v):
            raise EngineError(f"{total} layers do not split into {pp} stages x {v} virtual stages of equal size")
        k = total // (pp * v)
        ecfg.schedule, ecfg.v = ("interleaved", v) if v > 1 else ("1f1b", 1)
        ch = [k] * (pp * v)
        if account[0]:
            ch[0] -= 1
            ch[-1] -= 1
        ecfg.chunk_blocks = ch if v > 1 else None
        ecfg.device_blocks = [sum(ch[c * pp + i] for c in range(v)) for i in range(pp)]
        return
    ecfg.schedule = "1f1b"
    first, last = _int(args, "--decoder-first-pipeline-num-layers"), _int(args, "--decoder-last-pipeline-num-layers")
    rest = L - (first or 0) - (last or 0)
    mid = pp - (first is not None) - (last is not None)
    if mid < 0 or rest < 0 or (mid and rest % mid) or (not mid and rest):
        raise EngineError(f"{L} layers do not split into {pp} stages with the first / last stage counts given")
    k = rest // mid if mid else 0
    ecfg.device_blocks = [first if first is not None else k] + [k] * (pp - 2) + [last if last is not None else k]
