"""FP8 linear layers in and out of the engines' files (the cost model: sapp/costmodel/fp8.py, whose
recipes are "tensorwise", torchao's Float8Linear with dynamic per-tensor scales, "delayed", Transformer
Engine's delayed scaling, and "blockwise", Transformer Engine's Float8BlockScaling).  Each engine states
some of them, or none:

  megatron          --fp8-format e4m3|hybrid [--fp8-recipe delayed] <-> "delayed".  Megatron-Core runs
                    its blocks' linears through Transformer Engine; core_v0.16.1's default recipe is
                    delayed (cast-transpose with the amax fused, the FP8 weight and its transpose kept
                    across micro-batches).  The format does not change the price (both are one byte an
                    element: e4m3 everywhere, or e5m2 for the gradients), so either is read and "hybrid"
                    is written (NVIDIA's recipes train with it).
                    --fp8-format e4m3|hybrid --fp8-recipe blockwise <-> "blockwise" (core_v0.16.1
                    fp8_utils.get_fp8_recipe: TE's Float8BlockScaling(fp8_format), TE >= 2.3; DeepSeek-V3's
                    1x128 / 128x128 scales); "e4m3" is written, Float8BlockScaling's default and
                    DeepSeek-V3's format for every tensor.
                    Refused: tensorwise (TE's per-tensor *current* scaling: an amax pass before every
                    cast, neither of sapp's TE recipes), mxfp8 (1x32 blocks with e8m0 scales: Blackwell
                    only, costmodel/settings.py FP8_REFUSED), custom (code), --fp8-param-gather (FP8
                    weights kept and all-gathered at one byte), --no-fp8-wgrad (weight gradients in bf16)
                    and --first-last-layers-bf16 (fewer FP8 layers).
  torchtitan@0.2.2  [model] converters = ["quantize.linear.float8"] with [quantize.linear.float8]
                    filter_fqns = ["output"] <-> "tensorwise" (Float8LinearConverter's default config:
                    dynamic tensorwise scales, no FP8 all-gather; recipe_name "tensorwise" builds the same).
                    The output projection is filtered because sapp prices the head in bf16 (its job files
                    filter `output`).  Refused: "rowwise" recipes (per-row scales, not priced), FSDP's
                    float8 all-gather (weights gathered at one byte, not priced), other filters (which
                    linears run FP8), emulation, and the name "float8", which 0.2.2 does not register
                    (its trainer raises KeyError; the registered name is "quantize.linear.float8").  A
                    blockwise plan is refused on export: 0.2.2's Float8Linear recipe_name is "tensorwise",
                    "rowwise" or "rowwise_with_gw_hp" (config/job_config.py), and its only block-scaled
                    converters are MX (quantize.linear.mx, quantize.grouped_mm.mx: mxfp8, Blackwell).
  torchtitan (0.3)  Float8LinearConverter.Config has only rowwise recipes (recipe_name "rowwise" |
                    "rowwise_with_gw_hp", release/0.3 components/quantization/float8.py): refused both
                    ways; an FP8 plan is exported to torchtitan@0.2.2.
  deepspeed         DeepSpeed's JSON has no FP8 linear layers (Transformer Engine is the training
                    script's own module code): an FP8 plan is refused."""
from __future__ import annotations

from ..costmodel.settings import FP8_REFUSED
from .mapping import EngineError

# the recipes each engine's file states, its own first (a plan priced with another is re-priced so)
RECIPES = {"megatron": ("delayed", "blockwise"), "torchtitan@0.2.2": ("tensorwise",)}
RECIPE = {k: v[0] for k, v in RECIPES.items()}
WHY_NOT = {
    "torchtitan": "torchtitan 0.3's Float8LinearConverter scales rowwise only (recipe_name 'rowwise' or "
                  "'rowwise_with_gw_hp'), which sapp does not price; use --to torchtitan@0.2.2 (tensorwise)",
    "deepspeed": "DeepSpeed's JSON has no FP8 linear layers (Transformer Engine is the training script's own "
                 "code); export to megatron (--fp8-format) or torchtitan@0.2.2 (converters), or search without --fp8",
}
MEGATRON_FORMATS = ("e4m3", "hybrid")
TT_NAME = "quantize.linear.float8"                  # the converter name torchtitan 0.2.2 registers
TT_TP_RECIPE = "tensorwise-tp"      # with torchao's float8 tensor-parallel styles (engines/torchtitan_2506.py)
TT_FILTER = ["output"]                              # the head stays bf16, as sapp prices it
TT_NO_BLOCKWISE = ("torchtitan 0.2.2 has no blockwise scaling for float8 linears (Float8Linear recipe_name "
                   "tensorwise, rowwise or rowwise_with_gw_hp; its block-scaled converters are mxfp8, Blackwell "
                   "only); export to megatron (--fp8-recipe blockwise) or search with --fp8 tensorwise")
MEGATRON_FORMAT = {"delayed": "hybrid", "blockwise": "e4m3"}    # what the export writes (above)
# (--fp8-param-gather is refused by megatron_fields.check itself, with or without --fp8-format)
MEGATRON_REFUSED = ("--no-fp8-wgrad", "--disable-fp8-wgrad", "--first-last-layers-bf16")


def target_recipe(engine: str, asked: str) -> str:
    """The recipe a `--target engine` search prices with `--fp8 asked` (one line refusing a mismatch)."""
    want = RECIPE.get(engine)
    if want is None:
        raise EngineError(f"--fp8 with --target {engine}: {WHY_NOT[engine]}")
    if asked in RECIPES[engine]:
        return asked
    if asked == "blockwise":
        raise EngineError(f"--fp8 blockwise with --target {engine}: {TT_NO_BLOCKWISE}")
    if asked:
        raise EngineError(f"--fp8 {asked} with --target {engine}: {engine} runs FP8 linears as {want} scaling "
                          f"(sapp/engines/fp8.py); use --fp8 {want}")
    return want


def conform(out, engine: str, notes: list) -> None:
    """An FP8 plan's recipe as `engine` runs it: refused where the engine states none, the other
    recipe re-priced as the engine's own (with a note)."""
    if not out.fp8:
        return
    want = RECIPE.get(engine)
    if want is None:
        raise EngineError(f"the plan is priced with FP8 linear layers ({out.fp8}): {WHY_NOT[engine]}")
    if out.fp8 in RECIPES[engine]:
        return
    if out.fp8 == "blockwise":          # no engine's other recipe prices like it: refused, not re-priced
        raise EngineError(f"the plan is priced with blockwise FP8 scaling: {TT_NO_BLOCKWISE}")
    if out.fp8 == TT_TP_RECIPE and want == "tensorwise":
        notes.append("the plan was priced with float8 tensor-parallel all-gathers (tensorwise-tp); torchtitan "
                     "0.2.2 runs them in bf16 (its apply_tp looks for a converter named 'float8', which 0.2.2 "
                     f"registers as '{TT_NAME}'): re-priced as tensorwise")
        out.fp8 = want
    elif out.fp8 != want:
        notes.append(f"the plan was priced with {out.fp8} FP8 scaling; {engine} runs {want} "
                     f"({'Transformer Engine' if engine == 'megatron' else 'torchao Float8Linear'}): re-priced so")
        out.fp8 = want


# ---- Megatron-LM -----------------------------------------------------------------------------------
def megatron_args(fp8: str) -> list:
    return [f"--fp8-format {MEGATRON_FORMAT[fp8]}", f"--fp8-recipe {fp8}"] if fp8 else []


def megatron_read(args: dict) -> str:
    """The recipe an argument file trains with ("" for none); one line refusing what sapp does not price."""
    fmt = args.get("--fp8-format")
    if fmt is None:
        return ""
    if fmt not in MEGATRON_FORMATS:
        raise EngineError(f"--fp8-format {str(fmt)[:40]}: Megatron-LM takes {' or '.join(MEGATRON_FORMATS)}")
    recipe = args.get("--fp8-recipe", "delayed")            # core_v0.16.1's default
    if recipe in FP8_REFUSED:
        raise EngineError(f"--fp8-recipe {recipe}: {FP8_REFUSED[recipe]}")
    if recipe not in RECIPES["megatron"]:
        raise EngineError(f"--fp8-recipe {str(recipe)[:40]}: sapp prices Transformer Engine's delayed and blockwise "
                          f"scaling only (tensorwise is TE's current scaling, an amax pass before each cast; custom "
                          f"is code); use delayed or blockwise, or remove --fp8-format")
    for flag in MEGATRON_REFUSED:
        if args.get(flag):
            what = "bf16 first / last layers" if "bf16" in flag else "weight gradients computed in bf16"
            raise EngineError(f"{flag}: sapp does not price {what} beside --fp8-format; remove it to price the rest")
    if not args.get("--bf16"):
        raise EngineError("--fp8-format without --bf16: sapp prices FP8 linear layers beside bf16 mixed precision; "
                          "add --bf16")
    return recipe


# ---- torchtitan 0.2.2 ------------------------------------------------------------------------------
def torchtitan_read(doc: dict) -> str:
    """The recipe of a 0.2.2 job file ("" for none): [model] converters and [quantize.linear.float8]."""
    conv = (doc.get("model") or {}).get("converters", [])
    if isinstance(conv, str):                       # torchtitan's CLI form: "a,b"
        conv = [c.strip() for c in conv.split(",") if c.strip()]
    if not isinstance(conv, list) or not all(isinstance(c, str) for c in conv):
        raise EngineError(f"[model] converters = {str(conv)[:60]}: a list of converter names")
    if not conv:
        return ""
    if "float8" in conv:
        raise EngineError("[model] converters = ['float8']: torchtitan 0.2.2 registers the Float8 converter as "
                          f"'{TT_NAME}' (its trainer raises KeyError on 'float8'); write converters = ['{TT_NAME}']")
    other = [c for c in conv if c != TT_NAME]
    if other:
        raise EngineError(f"[model] converters = [{other[0][:40]!r}]: sapp prices only '{TT_NAME}' (tensorwise "
                          f"Float8Linear); remove it to price the rest")
    f8 = (((doc.get("quantize") or {}).get("linear") or {}).get("float8")) or {}
    recipe = f8.get("recipe_name")
    if recipe not in (None, "tensorwise"):
        raise EngineError(f"[quantize.linear.float8] recipe_name = {str(recipe)[:40]!r}: sapp prices tensorwise "
                          f"scaling only (rowwise scales per row); remove it or use \"tensorwise\"")
    for key, why in (("enable_fsdp_float8_all_gather", "FSDP's all-gather of float8 weights (one byte an element)"),
                     ("emulate", "emulated float8 GEMMs")):
        if f8.get(key, False) is not False:
            raise EngineError(f"[quantize.linear.float8] {key} = {f8[key]!r}: sapp does not price {why}; set it "
                              f"false to price the rest")
    filt = f8.get("filter_fqns", [])
    if filt != TT_FILTER:
        raise EngineError(f"[quantize.linear.float8] filter_fqns = {str(filt)[:60]}: sapp prices the blocks' "
                          f"linears in float8 and the output projection in bf16; write filter_fqns = [\"output\"]")
    return "tensorwise"


def torchtitan_sections(fp8: str) -> list:
    """The 0.2.2 TOML sections of an FP8 plan: the converter's table (the [model] key is added by the caller)."""
    if not fp8:
        return []
    return [("quantize.linear.float8", {"enable_fsdp_float8_all_gather": False,
                                        "precompute_float8_dynamic_scale_for_fsdp": False,
                                        "filter_fqns": list(TT_FILTER)})]
