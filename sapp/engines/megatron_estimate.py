"""Megatron-LM's own theoretical memory estimate (megatron/training/theoretical_memory_usage.py,
`report_theoretical_memory`), ported as plain arithmetic on an argument file's flags: `sapp export`
notes it, `--fit-engine-estimate` searches under it (estimate_fit.py), and the bench sets sapp's
predicted peak beside it, all without Megatron-LM installed.

Ported from NVIDIA/Megatron-LM main (commit d98e8a64dd): the weights-and-optimizer part there
splits the parameters into tensor-parallel, replicated and expert-sharded ones (expert parallelism and
expert tensor parallelism divide the routed experts; each kind's optimizer share is divided by its own
data-parallel size), which core_v0.16.1's version does not (it divides the experts by tp only).  The
activation part is the same in both: Korthikanti et al. 2022's per-layer terms (Table 2; flash
attention, so without the 5as/h term), the first stage's in-flight micro-batches, and 5% overhead on
the non-SP path.  `version="core_v0.16.1"` gives the older weights part.  What the estimator itself
leaves out (MoE routing buffers, the all-to-all's permuted tokens, allocator fragmentation) is not
added: this is Megatron's number, not a better one.

    est = estimate(tokens(text), world_size=64, vocab=32000)   # {"weights_mb", "activation_mb", "total_mb"}
"""
from __future__ import annotations

import math

MB = 1024 * 1024


def _i(a, flag, default=None):
    v = a.get(flag, default)
    return None if v is None else int(v)


def resolved(a: dict, world_size: int, vocab: int) -> dict:
    """The arguments the estimator reads, with Megatron's defaults and validate_args' derivations
    (ffn 4h or SwiGLU's 8h/3 rounded to 64, kv channels h/a, vocabulary padded to a multiple of
    128 x tp, expert-tp defaulting to tp, sequence parallelism off at tp 1)."""
    h, heads, L = _i(a, "--hidden-size"), _i(a, "--num-attention-heads"), _i(a, "--num-layers")
    tp, pp = _i(a, "--tensor-model-parallel-size", 1), _i(a, "--pipeline-model-parallel-size", 1)
    cp = _i(a, "--context-parallel-size", 1)
    swiglu = bool(a.get("--swiglu"))
    ffn = _i(a, "--ffn-hidden-size")
    if ffn is None:
        ffn = int((4 * h * 2 / 3) / 64) * 64 if swiglu else 4 * h
    mult = _i(a, "--make-vocab-size-divisible-by", 128) * tp
    padded = int(math.ceil(vocab / mult) * mult)
    k = _i(a, "--num-layers-per-virtual-pipeline-stage")
    vpp = _i(a, "--num-virtual-stages-per-pipeline-rank")
    if k is not None:
        vpp = L // pp // k
    dp = world_size // (tp * pp * cp)
    mbs = _i(a, "--micro-batch-size", 1)
    gb = _i(a, "--global-batch-size", mbs * dp)
    experts = _i(a, "--num-experts")
    return {"h": h, "heads": heads, "L": L, "tp": tp, "pp": pp, "dp": dp, "world": world_size, "ffn": ffn,
            "swiglu": swiglu, "kv_channels": _i(a, "--kv-channels", h // heads),
            "groups": _i(a, "--num-query-groups", heads) if a.get("--group-query-attention") else heads,
            "norm": a.get("--normalization", "LayerNorm"), "padded_vocab": padded,
            "untie": bool(a.get("--untie-embeddings-and-output-weights")), "experts": experts,
            "topk": _i(a, "--moe-router-topk", 2), "moe_ffn": _i(a, "--moe-ffn-hidden-size", ffn if experts else 0),
            "shared_ffn": _i(a, "--moe-shared-expert-intermediate-size", 0) or 0,
            "bias": not a.get("--disable-bias-linear"), "ep": _i(a, "--expert-model-parallel-size", 1),
            "etp": _i(a, "--expert-tensor-parallel-size", tp), "distopt": bool(a.get("--use-distributed-optimizer")),
            "s": _i(a, "--seq-length"), "mbs": mbs, "m": gb // (mbs * dp), "vpp": vpp,
            "sp": bool(a.get("--sequence-parallel")) and tp > 1,
            "selective": a.get("--recompute-granularity") == "selective" or bool(a.get("--recompute-activations")),
            "cp": cp, "bf16_grads": bool(a.get("--grad-reduce-in-bf16")),
            "full": a.get("--recompute-granularity") == "full", "rc_method": a.get("--recompute-method"),
            "rc_layers": _i(a, "--recompute-num-layers", 1)}


def weights_bytes(r: dict, version: str = "main", completed: bool = False) -> float:
    """compute_weight_and_optimizer_memory: the most loaded shard (first stage: its layers and the
    embedding) times 18 bytes a parameter, or 6 + 12 / dp with the distributed optimizer."""
    h, L, tp, pp = r["h"], r["L"], r["tp"], r["pp"]
    glu = 1.5 if r["swiglu"] else 1.0
    norm = 1 if r["norm"] == "RMSNorm" else 2
    attn = 2 * h * h * ((1 + r["groups"] / r["heads"]) * (r["kv_channels"] * r["heads"] / h))
    E = r["experts"]
    moe_layers = L if E else 0
    dense_layers = L - moe_layers
    emb = h * r["padded_vocab"]
    final_norm = norm * h

    g = 2 if completed and r["bf16_grads"] else 0        # bytes a parameter saved by bf16 main_grads
    if completed and version != "main":
        raise ValueError("completed=True extends main's formula")

    def per_param(dp):
        return (18 if not r["distopt"] else 6 + 12 / dp) - g

    if version == "core_v0.16.1":
        dense = 2 * h * (r["ffn"] * glu + norm) + attn
        moe = 2 * h * (r["moe_ffn"] * (E or 1) * glu + r["shared_ffn"] * glu + norm) + attn
        block = dense * dense_layers + moe * moe_layers + final_norm
        shard = (block / pp + emb) / tp + (emb / tp if r["untie"] and pp == 1 else 0)
        return shard * per_param(r["dp"])
    dense_mlp = 2 * h * r["ffn"] * glu
    shared = 2 * h * r["shared_ffn"] * glu
    routed = 2 * h * r["moe_ffn"] * (E or 0) * glu
    ln = 2 * h * norm
    router = (h * E + (E if r["bias"] else 0)) if E else 0
    tp_block = (attn + dense_mlp) * dense_layers + (attn + shared) * moe_layers
    rep_block = ln * dense_layers + (ln + router) * moe_layers + final_norm
    exp_block = routed * moe_layers
    tp_shard = (tp_block / pp + emb) / tp
    rep_shard = rep_block / pp
    exp_shard = exp_block / pp / (r["etp"] * r["ep"])
    if r["untie"] and pp == 1:
        tp_shard += emb / tp
    edp = r["world"] // (r["etp"] * r["ep"] * pp)
    dp = r["dp"] * (r["cp"] if completed else 1)        # the distributed optimizer shards over dp x cp
    return (tp_shard + rep_shard) * per_param(dp) + exp_shard * per_param(edp)


def _pipeline_factor(r, act):
    pp, vpp = r["pp"], r["vpp"]
    if vpp is not None:
        act *= 1 + (pp - 1) / (pp * vpp)
    elif pp > 1:
        act *= min(1, r["m"] / pp)
    return act


def _layers(r, per_layer, completed):
    """The L layers' activations; `completed`: full recomputation keeps only a recomputed layer's (block)
    or group's (uniform) bf16 input, 2sbh (the SP path divides the whole by tp afterwards)."""
    L = r["L"]
    if not (completed and r["full"]):
        return per_layer * L
    keep = 2 * r["s"] * r["mbs"] * r["h"]
    if r["rc_method"] == "uniform":
        return keep * math.ceil(L / r["rc_layers"])
    n = min(r["rc_layers"], L // r["pp"]) * r["pp"]        # block: the first N layers of every stage
    return per_layer * (L - n) + keep * n


def activation_bytes(r: dict, completed: bool = False, layer_sbh: float | None = None) -> float:
    """compute_activation_memory (SP with selective recomputation) or compute_activation_memory_without_sp.
    `completed` adds what the estimator leaves out: context parallelism (each rank holds s/cp tokens)
    and full recomputation (see _layers).  `layer_sbh`: a layer's bytes per token over h in place of the
    formula's (a dense layer's, Korthikanti's), e.g. what Megatron-Core's own MoE layer is measured to
    keep (bench/megatron_saved_activations.py); everything else is the formula's."""
    s, b, h, tp, pp, V = r["s"], r["mbs"], r["h"], r["tp"], r["pp"], r["padded_vocab"]
    if completed:
        r = dict(r, s=s // r["cp"])
        s = r["s"]
    if r["sp"] and r["selective"]:
        act = _layers(r, s * b * h * (layer_sbh if layer_sbh is not None else 18 + 4 * r["ffn"] / h), completed)
        act += 8 * s * b * pp + s * b * h * pp
        act = _pipeline_factor(r, act)
        if pp == 1:
            act += s * b * h * 4 * (1 + V / h)
        return act / tp
    act = _layers(r, s * b * h * (layer_sbh if layer_sbh is not None else 10 + 24 / tp), completed)
    act += 8 * s * b * pp + s * b * h * pp
    act = _pipeline_factor(r, act)
    if pp == 1:
        act += (s * b * V / tp + s * b * h) * 2
    return act * 1.05


def estimate(args: dict, *, world_size: int, vocab: int, version: str = "main", completed: bool = False,
             layer_sbh: float | None = None) -> dict:
    """Megatron's theoretical memory (MB = MiB, as it prints them) for `args` ({flag: value} as
    sapp.engines.megatron.tokens reads a file) on `world_size` GPUs with a tokenizer of `vocab`.
    `completed=True` is no longer Megatron's number: its formula with the terms it leaves out added
    (bf16 main_grads under --grad-reduce-in-bf16; context parallelism: s/cp tokens a rank and the
    distributed optimizer sharded over dp x cp; full recomputation)."""
    r = resolved(args, world_size, vocab)
    w, act = weights_bytes(r, version, completed), activation_bytes(r, completed, layer_sbh)
    return {"weights_mb": w / MB, "activation_mb": act / MB, "total_mb": (w + act) / MB,
            "total_bytes": w + act}
