"""Megatron-LM's recomputation flags, read and written: --recompute-granularity selective (with
--recompute-modules: the named modules, priced by sapp/recompute/modules.py; without: core_attn, the
attention core), full on every layer (--recompute-method uniform --recompute-num-layers 1), or full
on the first N layers of every (virtual) stage (--recompute-method block --recompute-num-layers N).

The modules' checks are Megatron-Core core_v0.16.1's own (TransformerConfig.__post_init__): moe_act
needs --moe-grouped-gemm, mla_up_proj --multi-latent-attention; moe_act and layernorm are refused under
FP8's delayed recipe;
--moe-layer-recompute is selective recomputation with moe added (and refused beside full)."""
from __future__ import annotations

from .mapping import EngineError, counted_recompute, uniform_policy

# CostSettings.RECOMPUTE_MODULES: every module Megatron-Core core_v0.16.1 allows (its allowed_modules)
PRICED = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts")
ALLOWED = set(PRICED)


def runs(ecfg, L):
    """Blocks per recompute run: per virtual stage (interleaved) or per stage."""
    if ecfg.schedule == "interleaved" and ecfg.chunk_blocks:
        return list(ecfg.chunk_blocks)
    return list(ecfg.device_blocks) if ecfg.device_blocks else [L]


def _rc_words(rc, rs):
    if isinstance(rc, str):
        return f"{rc} on every layer"
    n = max(sum(1 for p in list(rc.values())[sum(rs[:i]):sum(rs[:i + 1])] if p == "full") for i in range(len(rs)))
    return f"full on the first {n} layer(s) of every stage"


def conform(out, names, notes) -> None:
    """`out.recompute` made one Megatron states (in place), with a note when it changed."""
    L = len(names)
    rc = out.recompute
    if not isinstance(rc, str) and uniform_policy(rc) is None:
        rs = runs(out, L)
        pols = [rc[b] for b in names]
        if "full" in pols:
            pos, n = 0, 0
            for k in rs:
                n = max(n, sum(1 for p in pols[pos:pos + k] if p != "none"))
                pos += k
            new = counted_recompute(rs, names, n)
        else:
            new = "selective"
        if new != rc:
            notes.append("Megatron recomputes one way on every layer, or fully on the first N of each stage: "
                         f"per-block recomputation exported as {_rc_words(new, rs)}")
        out.recompute = new
    elif not isinstance(rc, str):
        out.recompute = uniform_policy(rc)
    if out.recompute != "selective":
        out.recompute_modules = ()       # (read by Megatron only beside selective; priced only there)
    check_modules(out.recompute_modules, grouped_gemm=True, fp8=out.fp8)


def check_modules(mods, *, grouped_gemm: bool, fp8: str) -> None:
    """Megatron-Core's own refusals of a module list (TransformerConfig.__post_init__), in one line."""
    if "moe_act" in mods and not grouped_gemm:
        raise EngineError("--recompute-modules moe_act: Megatron-Core supports it only with --moe-grouped-gemm; "
                          "add it")
    if fp8 == "delayed" and {"moe_act", "layernorm"} & set(mods):
        raise EngineError("--recompute-modules moe_act / layernorm: Megatron-Core refuses them under FP8's delayed "
                          "recipe; leave them out")


def flags(ecfg, names) -> list:
    """The recomputation flags of `ecfg` (conformed)."""
    rc, a = ecfg.recompute, []
    if rc == "selective":
        a.append("--recompute-granularity selective")
        if ecfg.recompute_modules:
            a.append("--recompute-modules " + " ".join(ecfg.recompute_modules))
    elif rc == "full":
        a += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    elif isinstance(rc, dict):
        rs = runs(ecfg, len(names))
        n = max(sum(1 for b in names[sum(rs[:i]):sum(rs[:i + 1])] if rc[b] == "full") for i in range(len(rs)))
        a += ["--recompute-granularity full", "--recompute-method block", f"--recompute-num-layers {n}"]
    return a


def modules(args, gran) -> tuple:
    """The modules selective recomputation recomputes, sorted; () for core_attn alone (sapp's selective)."""
    v = args.get("--recompute-modules")
    mods = ["core_attn"] if v is None else [] if v is True else str(v).split()
    if args.get("--moe-layer-recompute") and "moe" not in mods:
        mods.append("moe")                # Megatron-Core: deprecated, the same as moe in the list
    bad = sorted(set(mods) - ALLOWED)
    if bad:
        raise EngineError(f"--recompute-modules {' '.join(bad)}: Megatron-Core core_v0.16.1 allows only "
                          f"{', '.join(sorted(ALLOWED))}; remove it")
    if "mla_up_proj" in mods and not args.get("--multi-latent-attention"):
        raise EngineError("--recompute-modules mla_up_proj: Megatron-Core supports it only with "
                          "--multi-latent-attention; remove it")
    out = tuple(sorted(set(mods)))
    return () if out == ("core_attn",) else out


def read(args, ecfg, L, names, notes):
    """The recomputation an argument file states: "none", "selective", "full" or {block: policy};
    ecfg.recompute_modules set for selective."""
    gran = args.get("--recompute-granularity") or ("selective" if args.get("--recompute-activations") else None)
    if args.get("--moe-layer-recompute"):
        if gran == "full":
            raise EngineError("--moe-layer-recompute with --recompute-granularity full: Megatron-Core refuses the "
                              "two together; use --recompute-granularity selective --recompute-modules moe")
        gran = "selective"
    if gran in (None, True):
        return "none"
    if gran == "selective":
        mods = modules(args, gran)
        if args.get("--recompute-modules") is True and not args.get("--moe-layer-recompute"):
            notes.append("--recompute-modules with no module recomputes nothing: priced without recomputation")
            return "none"
        check_modules(mods, grouped_gemm=bool(args.get("--moe-grouped-gemm")), fp8=ecfg.fp8)
        ecfg.recompute_modules = mods
        return "selective"
    if gran != "full":
        raise EngineError(f"--recompute-granularity {gran!r}: use full or selective")
    method, n = args.get("--recompute-method", "uniform"), _int(args, "--recompute-num-layers", 1)
    if method == "uniform":
        if n != 1:
            notes.append(f"--recompute-method uniform --recompute-num-layers {n} checkpoints groups of {n} layers; "
                         f"priced as every layer recomputed on its own (the same recomputation, more memory than "
                         f"Megatron keeps)")
        return "full"
    if method != "block":
        raise EngineError(f"--recompute-method {method!r}: use uniform or block")
    rs = (list(ecfg.chunk_blocks) if ecfg.chunk_blocks else list(ecfg.device_blocks) if ecfg.device_blocks else [L])
    if n >= max(rs):
        return "full"
    if n <= 0:
        return "none"
    return counted_recompute(rs, names, n)


def _int(args, flag, default):
    v = args.get(flag, default)
    try:
        return int(v)
    except (TypeError, ValueError):
        raise EngineError(f"{flag} must be a whole number, got {v!r}") from None
