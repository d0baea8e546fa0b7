"""The model half of a Megatron-LM argument file: the flags that make Megatron-Core build the
architecture sapp priced (sapp/engines/arch.py), and what an imported file builds differently."""
from __future__ import annotations

import math

from .arch_hf import rope_factor
from .mapping import EngineError

# the environment Megatron-LM asserts for Megatron-Core's tensor-parallel layers, whose overlap of a
# collective with the next GEMM relies on one CUDA connection scheduling kernels in launch order: a
# comment line, which `$(grep -v '^#' file)` skips
ENV = "environment: CUDA_DEVICE_MAX_CONNECTIONS=1"
# the rest of the model's description (model_args): compared with the priced model (model_notes)
MODEL = ("--kv-channels", "--vocab-size", "--make-vocab-size-divisible-by", "--normalization", "--norm-epsilon",
         "--swiglu", "--position-embedding-type", "--rotary-base", "--use-rope-scaling", "--rope-scaling-factor",
         "--window-size", "--window-attn-skip-freq", "--disable-bias-linear", "--qk-layernorm", "--rotary-percent",
         "--add-qkv-bias", "--untie-embeddings-and-output-weights", "--attention-dropout", "--hidden-dropout",
         "--moe-ffn-hidden-size", "--moe-token-dispatcher-type", "--moe-grouped-gemm",
         "--moe-shared-expert-intermediate-size", "--moe-shared-expert-gate", "--moe-router-pre-softmax",
         "--moe-layer-freq", "--grad-reduce-in-bf16", *("--multi-latent-attention --q-lora-rank --kv-lora-rank "
                                                        "--qk-head-dim --qk-pos-emb-head-dim --v-head-dim").split(),
         "--accumulate-allreduce-grads-in-fp32")


# multi-latent attention's flags (sapp/engines/arch_mla.py writes them), compared by check_arch
MLA = ("--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim",
       "--v-head-dim")


def megatron_mla(a: dict) -> list:
    from .arch_mla import megatron_args
    return megatron_args(a)


def model_args(a: dict, tp: int) -> list:
    """The flags that make Megatron build the architecture `a` (sapp/engines/arch.py) and nothing else:
    Megatron's defaults (LayerNorm, GELU, learned positions, biases, tied output, dropout 0.1, a
    vocabulary padded to a multiple of 128 x tp, the allgather MoE dispatcher) are stated whenever the
    model differs from them."""
    if a.get("capacity_factor"):
        raise EngineError("the model drops tokens past an expert capacity, which sapp prices only as padding; "
                          "Megatron's --moe-expert-capacity-factor is not priced: use a dropless model")
    h, V = a["hidden"], a["vocab"]
    if V % tp:
        raise EngineError(f"Megatron pads the vocabulary ({V}) to a multiple of tp {tp}, a larger model than "
                          f"priced; search again with a tp that divides {V}")
    out = [f"--num-layers {a['layers']}", f"--hidden-size {h}", f"--ffn-hidden-size {a['ffn']}",
           f"--num-attention-heads {a['heads']}"]
    if a["kv_heads"] != a["heads"] and not a.get("mla"):
        out += ["--group-query-attention", f"--num-query-groups {a['kv_heads']}"]
    if a["head_dim"] * a["heads"] != h and not a.get("mla"):
        out.append(f"--kv-channels {a['head_dim']}")
    out += [f"--seq-length {a['seq']}", f"--max-position-embeddings {max(a['max_pos'] or 0, a['seq'])}"]
    # the tokenizer's vocabulary as it is (no padding): a divisor that tp x it divides V
    out += [f"--vocab-size {V}", f"--make-vocab-size-divisible-by {math.gcd(V // tp, 128)}"]
    out += [f"--normalization {a['norm']}", f"--norm-epsilon {a['norm_eps']:g}"]
    if a["glu"]:
        out.append("--swiglu")
    out.append(f"--position-embedding-type {a['position']}")
    if a["position"] == "rope":
        if a.get("rope_base"):
            out.append(f"--rotary-base {int(a['rope_base'])}")
        if megatron_rope_factor(a.get("rope_scaling")):
            out += ["--use-rope-scaling", "--rope-scaling-factor 8"]
        if a.get("rotary_percent", 1.0) != 1.0:
            out.append(f"--rotary-percent {a['rotary_percent']:g}")
    if a.get("qk_norm") and not a.get("mla"):
        out.append("--qk-layernorm")
    out += window_args(a)
    if not a["bias"]:
        out.append("--disable-bias-linear")
        if a["qkv_bias"]:
            out.append("--add-qkv-bias")
    if not a["tied"]:
        out.append("--untie-embeddings-and-output-weights")
    drop = 0.0 if a["position"] == "rope" else 0.1
    out += [f"--attention-dropout {a.get('attention_dropout', drop)}", f"--hidden-dropout {a.get('hidden_dropout', drop)}"]
    if a.get("experts"):
        out += [f"--num-experts {a['experts']}", f"--moe-router-topk {a['top_k']}",
                f"--moe-ffn-hidden-size {a['expert_ffn']}", "--moe-token-dispatcher-type alltoall",
                "--moe-grouped-gemm"]
        if a.get("shared_ffn"):
            out.append(f"--moe-shared-expert-intermediate-size {a['shared_ffn']}")
        out += moe_routing_args(a)
        if a.get("mla"):
            out += megatron_mla(a)
        d, mask = a.get("dense_layers", 0), a.get("moe_layers")
        if mask:            # MoE on some layers only (Qwen2-MoE's decoder_sparse_step / mlp_only_layers)
            out.append("--moe-layer-freq [" + ",".join(str(int(m)) for m in mask) + "]")
        elif d:
            out.append(f"--moe-layer-freq ([0]*{d}+[1]*{a['layers'] - d})")
    return out


def megatron_rope_factor(rs) -> float | None:
    """The Llama 3 rope scaling factor Megatron-LM trains with, or None: core_v0.16.1's gpt_builders.py builds
    GPTModel with rope_scaling=--use-rope-scaling but never passes --rope-scaling-factor, so the model
    always scales by GPTModel's default 8 (Llama 3.2's 32 is parsed and dropped): another factor is refused."""
    if not rs:
        return None
    if not isinstance(rs, dict):
        raise EngineError(f"rope_scaling {str(rs)[:60]!r}: Megatron states Llama 3's rope scaling only")
    factor = rope_factor(rs)
    if factor != 8.0:
        raise EngineError(f"rope_parameters.factor {factor:g}: Megatron-LM core_v0.16.1's GPT builder (gpt_builders.py) "
                          f"does not pass --rope-scaling-factor, so Megatron-Core scales rope by 8; export to "
                          f"deepspeed (or torchtitan, whose llama3 also scales by 8 only)")
    return factor


def moe_routing_args(a: dict) -> list:
    """Qwen2-MoE's sigmoid gate on its shared expert (Megatron-Core's SharedExpertMLP gate_weight, the same
    (1, hidden) weight and sigmoid as HF's shared_expert_gate) and its routing without renormalising the
    top-k (norm_topk_prob false: softmax over every expert, then top-k, as --moe-router-pre-softmax does;
    Megatron's default takes the softmax over the k chosen, HF's norm_topk_prob true)."""
    return (["--moe-shared-expert-gate"] if a.get("shared_gate") else []) + \
        (["--moe-router-pre-softmax"] if a.get("router_pre_softmax") else [])


def window_args(a: dict) -> list:
    """Sliding-window attention as Megatron-Core states it (TransformerConfig.window_size (left, right): a
    query attends to the keys from left before it to right after it, so HF's window of w tokens, itself
    included, is (w - 1, 0)); layers of full attention among them as --window-attn-skip-freq, 1 where a
    layer attends within the window (utils.is_layer_window_attention)."""
    w = a.get("window")
    if not w:
        return []
    out = [f"--window-size {w - 1},0"]
    mask = a.get("window_layers")
    if mask:
        n = mask.index(False) + 1 if False in mask else 0
        every = n > 0 and all(m == ((i + 1) % n != 0) for i, m in enumerate(mask))
        out.append(f"--window-attn-skip-freq {n}" if every else
                   "--window-attn-skip-freq [" + ",".join(str(int(m)) for m in mask) + "]")
    return out


def check_arch(args, arch) -> None:
    """The attention window and rope scaling an argument file states against the --model's: Megatron would
    train another attention than the one priced, refused in one line (issue 52 item 2)."""
    if arch is None:
        return
    want = dict((f.split(" ", 1) + [True])[:2] for f in window_args(arch))
    for flag in ("--window-size", "--window-attn-skip-freq"):
        got = args.get(flag)
        got = None if got is None else str(got).replace(" ", "").strip("()")
        if got != want.get(flag) and not (flag == "--window-attn-skip-freq" and got is None and "--window-size" not in want):
            raise EngineError(f"{flag} {got or '(absent)'} but the model has {want.get(flag) or 'none'} "
                              f"({'its window' if arch.get('window') else 'full attention'}); pass the --model this "
                              f"file trains, or set {flag} to match it")
    want = moe_routing_args(arch) if arch.get("experts") else []
    for flag in ("--moe-shared-expert-gate", "--moe-router-pre-softmax"):
        if bool(args.get(flag)) != (flag in want):
            raise EngineError(f"{flag} {'set' if args.get(flag) else 'absent'} but the model has "
                              f"{'it' if flag in want else 'none'} (Megatron would route or gate otherwise than "
                              f"priced); pass the --model this file trains, or {'add' if flag in want else 'drop'} {flag}")
    rs = arch.get("rope_scaling") if arch.get("position") == "rope" else None
    factor = megatron_rope_factor(rs)
    # (whatever --rope-scaling-factor says: core_v0.16.1's builder scales by 8, see megatron_rope_factor)
    got = 8.0 if args.get("--use-rope-scaling") else None
    if got != factor:
        raise EngineError(f"--use-rope-scaling gives {got or 'no rope scaling'} but the model has {factor or 'none'}; "
                          f"pass the --model this file trains, or match its rope scaling")
    mla = dict((f.split(" ", 1) + [True])[:2] for f in megatron_mla(arch)) if arch.get("mla") else {}
    for flag in MLA:
        if str(args.get(flag)) != str(mla.get(flag)):
            raise EngineError(f"{flag} {args.get(flag, '(absent)')} but the model has {mla.get(flag, 'none')} (Megatron "
                              f"would build another attention than priced); pass the --model this file trains, or "
                              f"set {flag} to match it")
    for flag, want, got in (("--qk-layernorm", bool(arch.get("qk_norm") or arch.get("mla")),
                             bool(args.get("--qk-layernorm"))),
                            ("--rotary-percent", float(arch.get("rotary_percent", 1.0)),
                             float(args.get("--rotary-percent", 1.0)))):
        if want != got:
            raise EngineError(f"{flag} {got} but the model has {want} (Megatron would build another attention than "
                              f"priced); pass the --model this file trains, or set {flag} to match it")


def model_notes(args, arch, tp, precision) -> list:
    """What Megatron runs from this file that differs from the priced model and step, in notes (the
    sizes themselves are checked by _check_shape)."""
    out = []
    if arch is None:
        return out
    try:
        want = dict((f.split(" ", 1) + [True])[:2] for f in model_args(arch, tp))
    except EngineError:
        return out
    skip = {"--seq-length", "--max-position-embeddings", "--num-layers", "--hidden-size", "--ffn-hidden-size",
            "--num-attention-heads", "--num-query-groups", "--group-query-attention", "--num-experts",
            "--moe-router-topk", "--make-vocab-size-divisible-by", "--vocab-size", "--use-rope-scaling",
            "--rope-scaling-factor", "--window-size", "--window-attn-skip-freq", "--moe-shared-expert-gate",
            "--moe-router-pre-softmax", "--qk-layernorm", "--rotary-percent", *MLA}      # (check_arch refuses those)
    defaults = {"--normalization": "LayerNorm", "--position-embedding-type": "learned_absolute",
                "--moe-token-dispatcher-type": "allgather", "--attention-dropout": "0.1", "--hidden-dropout": "0.1",
                "--moe-ffn-hidden-size": args.get("--ffn-hidden-size", False)}   # Megatron's default: the dense ffn
    differ = []
    for flag, v in want.items():
        if flag in skip or flag in ("--norm-epsilon", "--rotary-base"):
            continue
        got = args.get(flag, defaults.get(flag, False))
        if str(got) != str(v):
            differ.append(f"{flag} {got if got is not False else '(absent)'} (the model: {v})")
    for flag in ("--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--add-qkv-bias"):
        if args.get(flag) and flag not in want:
            differ.append(f"{flag} (the model has none)")
    if differ:
        out.append("Megatron builds another model from this file than the one priced: " + "; ".join(differ))
    return out
