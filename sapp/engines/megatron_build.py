"""The model a Megatron-LM argument file states, built on meta with the zoo's builders: `sapp import
--from megatron FILE --cluster C` without --model prices the model the file trains.

The flags are data (megatron.tokens: shlex, nothing executed).  They choose one of three builders:
  GPT    (sapp/models/gpt.py)    LayerNorm, GELU, learned absolute positions, biases, tied or untied
                                 output, one dropout, fused attention (Megatron's default backend);
  Llama  (sapp/models/llama.py)  RMSNorm, SwiGLU, rotary positions (--rotary-base), no biases, untied,
                                 grouped-query attention, no dropout;
  MoE    (sapp/models/moe.py)    the Llama layer with --num-experts routed experts (top-k, expert ffn,
                                 shared experts, dense first layers), rotary positions as the Llama.
The vocabulary is --vocab-size, or the fixed vocabulary of a named tokenizer (GPT2BPETokenizer 50257,
Llama2Tokenizer 32000), padded as Megatron pads it (to a multiple of --make-vocab-size-divisible-by x
tp).  Unstated sizes take Megatron's defaults (ffn 4h, or SwiGLU's 8h/3 rounded down to 64; top-k 2;
the expert ffn = ffn).  A stated feature none of the builders has is refused in one line naming its
flag.  The plan names the file (its model.name) and holds the built config in model.meta, which the
export reads back (sapp/engines/arch.py): the round trip states the same model.  An export that must
re-price such a plan builds the model again from the file it names (`names_a_file`, `from_file`; the
plan's fingerprint check refuses a file that changed), as an HF plan's config.json is read again."""
from __future__ import annotations

import math
import re

from .mapping import EngineError
from .megatron import _int, tokens
from .megatron_fields import check

# tokenizers with one published vocabulary (before Megatron's padding)
TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257, "Llama2Tokenizer": 32000}
# sizes past any model: a file stating more is refused before anything is built
MOST = {"--num-layers": 1 << 12, "--hidden-size": 1 << 18, "--num-attention-heads": 1 << 12, "--seq-length": 1 << 24,
        "--ffn-hidden-size": 1 << 21, "--moe-ffn-hidden-size": 1 << 21, "--num-query-groups": 1 << 12,
        "--kv-channels": 1 << 12, "--num-experts": 1 << 14, "--moe-router-topk": 1 << 14, "--vocab-size": 1 << 24,
        "--make-vocab-size-divisible-by": 1 << 16, "--tensor-model-parallel-size": 1 << 16}
_DENSE_FIRST = re.compile(r"^\(\[0\]\*(\d+)\+\[1\]\*(\d+)\)$")      # what model_args writes for dense layers


def config(args: dict) -> tuple:
    """(kind, zoo config) of the model the flags state; EngineError naming the flag it cannot build."""
    for flag in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length"):
        if flag not in args:
            raise EngineError(f"{flag} is missing: the file must state the model to price it without --model")
    L, h, a, s = (_size(args, f) for f in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length"))
    if h % a:
        raise EngineError(f"--hidden-size {h} is not a multiple of --num-attention-heads {a}")
    swiglu = bool(args.get("--swiglu"))
    ffn = _size(args, "--ffn-hidden-size", max(64, int((4 * h * 2 / 3) / 64) * 64) if swiglu else 4 * h)
    kv = _size(args, "--num-query-groups", 1) if args.get("--group-query-attention") else a
    if a % kv:
        raise EngineError(f"--num-query-groups {kv} must divide --num-attention-heads {a}")
    hd = _size(args, "--kv-channels", h // a)
    V = _vocab(args)
    experts = _size(args, "--num-experts", None)
    norm = args.get("--normalization", "LayerNorm")
    pos = args.get("--position-embedding-type", "learned_absolute")
    bias, tied = not args.get("--disable-bias-linear"), not args.get("--untie-embeddings-and-output-weights")
    drops = {f: _num(args, f, 0.1) for f in ("--attention-dropout", "--hidden-dropout")}
    _need(not args.get("--qk-layernorm"), "--qk-layernorm", "", "the zoo's builders (no query/key norm)")
    _need(not args.get("--multi-latent-attention"), "--multi-latent-attention", "",
          "the zoo's builders (q/k/v from full-width projections)")
    gpt_like = not experts and norm == "LayerNorm" and not swiglu and pos == "learned_absolute"
    if gpt_like:
        _need(kv == a, "--num-query-groups", f"{kv} (grouped-query attention)", "the GPT builder (LayerNorm, GELU)")
        _need(hd == h // a, "--kv-channels", hd, "the GPT builder (head width = hidden / heads)")
        _need(bias, "--disable-bias-linear", "", "the GPT builder (LayerNorm, GELU, biases)")
        _need(drops["--attention-dropout"] == drops["--hidden-dropout"], "--attention-dropout",
              f"{drops['--attention-dropout']} beside --hidden-dropout {drops['--hidden-dropout']}",
              "the GPT builder (one dropout rate)")
        mp = _size(args, "--max-position-embeddings", s)
        _need(mp == s, "--max-position-embeddings", f"{mp} beside --seq-length {s}",
              "the GPT builder (a position table of the sequence length)")
        return "gpt", {"l": L, "h": h, "a": a, "V": V, "s": s, "ffn": ffn, "dropout": drops["--hidden-dropout"],
                       "tie_embeddings": tied, "attn": "sdpa"}
    what = "the MoE builder (RMSNorm, SwiGLU, rope, no bias, untied)" if experts else \
        "the Llama builder (RMSNorm, SwiGLU, rope, no bias, untied)"
    _need(norm == "RMSNorm", "--normalization", norm, what)
    _need(swiglu, "--swiglu", "(absent: GELU)", what)
    _need(pos == "rope", "--position-embedding-type", pos, what)
    _need(not bias, "--disable-bias-linear", "(absent: biases)", what)
    _need(not args.get("--add-qkv-bias"), "--add-qkv-bias", "", what)
    _need(not tied, "--untie-embeddings-and-output-weights", "(absent: a tied output layer)", what)
    _need(not args.get("--use-rope-scaling"), "--use-rope-scaling", "", what)
    _need(not args.get("--window-size"), "--window-size", args.get("--window-size"), what + " (full attention)")
    for f, p in drops.items():
        _need(p == 0, f, f"{p:g}" + ("" if f in args else " (Megatron's default)"), what + " with no dropout")
    if not experts:
        _need(hd == h // a, "--kv-channels", hd, what + " (head width = hidden / heads)")
        return "llama", {"l": L, "h": h, "a": a, "kv": kv, "V": V, "s": s, "ffn": ffn,
                         "theta": _num(args, "--rotary-base", 10000), "eps": _num(args, "--norm-epsilon", 1e-5)}
    top_k = _size(args, "--moe-router-topk", 2)
    eff = _size(args, "--moe-ffn-hidden-size", ffn)
    if top_k > experts:
        raise EngineError(f"--moe-router-topk {top_k} must be at most --num-experts {experts}")
    shared_ffn = _int(args, "--moe-shared-expert-intermediate-size", 0) or 0
    if not 0 <= shared_ffn <= MOST["--ffn-hidden-size"]:
        raise EngineError(f"--moe-shared-expert-intermediate-size {shared_ffn} must be 0 to "
                          f"{MOST['--ffn-hidden-size']}")
    _need(shared_ffn % eff == 0, "--moe-shared-expert-intermediate-size", shared_ffn,
          f"{what} (shared experts of the expert width {eff})")
    for flag in ("--moe-shared-expert-gate", "--moe-router-pre-softmax"):
        _need(not args.get(flag), flag, "", f"{what} (a shared expert without a gate, softmax over the top-k)")
    dense = 0
    freq = args.get("--moe-layer-freq")
    if freq is not None and str(freq) != "1":
        m = _DENSE_FIRST.match(str(freq).replace(" ", ""))
        _need(m and int(m.group(1)) + int(m.group(2)) == L, "--moe-layer-freq", freq,
              f"{what} (dense layers first, then MoE: ([0]*d+[1]*(layers-d)))")
        dense = int(m.group(1))
    return "moe", {"l": L, "h": h, "a": a, "kv": kv, "V": V, "s": s, "ffn": ffn, "experts": experts, "top_k": top_k,
                   "expert_ffn": eff, "shared": shared_ffn // eff, "dense": dense, "hd": hd, "capacity_factor": 0.0,
                   "eps": _num(args, "--norm-epsilon", 1e-5), "theta": _num(args, "--rotary-base", 10000)}


def _size(args, flag, default=0):
    """A whole number from 1 to MOST[flag] (absent: `default`, None allowed)."""
    if args.get(flag) is True:
        raise EngineError(f"{flag} needs a value")
    v = _int(args, flag, default)
    if v is None or (flag not in args and default):
        return v
    if not 1 <= v <= MOST.get(flag, 1 << 24):
        raise EngineError(f"{flag} {v}: give a whole number from 1 to {MOST.get(flag, 1 << 24)}")
    return v


def _num(args, flag, default) -> float:
    v = args.get(flag, default)
    try:
        out = float(v)
    except (TypeError, ValueError):
        raise EngineError(f"{flag} must be a number, got {str(v)[:40]!r}") from None
    if not math.isfinite(out) or out < 0:
        raise EngineError(f"{flag} {v}: give a finite number of at least 0")
    return out


def _need(ok, flag, value, what):
    if not ok:
        raise EngineError(f"{flag} {value}".rstrip() + f": {what} cannot build it; give --model NAME (a zoo "
                          f"model, pkg.module:factory or an HF config.json) to price this file")


def _vocab(args) -> int:
    """The vocabulary Megatron builds: the tokenizer's, padded to a multiple of divisible-by x tp."""
    V = _size(args, "--vocab-size", None)
    if V is None:
        tok = args.get("--tokenizer-type")
        V = TOKENIZER_VOCAB.get(tok)
        if V is None:
            raise EngineError(f"the file does not state the vocabulary (--tokenizer-type {tok or '(absent)'}): add "
                              f"--vocab-size N (the tokenizer's size) or --tokenizer-type "
                              f"{' / '.join(TOKENIZER_VOCAB)}")
    mult = _size(args, "--make-vocab-size-divisible-by", 128) * _size(args, "--tensor-model-parallel-size", 1)
    return int(math.ceil(V / mult) * mult)


def build(text: str, name: str):
    """The module the argument file `text` states, on meta, named `name` (the file) in its sapp_spec."""
    import torch

    from ..models.meta import skip_init
    from ..models.registry import BUILDERS
    from ..models.zoo import ModelSpec
    args = tokens(text)
    check(args)
    kind, cfg = config(args)
    cls, _ = BUILDERS[kind]
    with torch.device("meta"), skip_init():
        model = cls(**cfg)
    model.sapp_spec = ModelSpec(name=name, config=cfg, kind=kind)
    return model


def names_a_file(plan) -> bool:
    """Whether the plan's model was built from an argument file (its name is that file, not a zoo model)."""
    from ..models import zoo
    from ..models.resolve import kind_of
    name, meta = plan["model"]["name"], plan["model"].get("meta") or {}
    return isinstance(name, str) and kind_of(name) == "zoo" and name not in zoo.names() and \
        isinstance(meta, dict) and meta.get("kind") in ("gpt", "llama", "moe")


def from_file(path: str):
    """The model the argument file at `path` states (read as data, bounded)."""
    from ..fileio import read_regular
    try:
        raw = read_regular(path, 4 << 20)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise EngineError(f"cannot read the argument file the plan's model was built from, {path} "
                          f"({type(e).__name__}); run where it is, or pass --model NAME") from None
    return build(text, path)
