"""Hugging Face models from a config file: config.json -> AutoConfig -> AutoModelFor... built on the
requested device (meta for search: nothing allocated, no download), plus example data.

The model class is the config's `architectures[0]` when transformers has it, else the first Auto
class that accepts the config (causal LM, seq2seq LM, masked LM, image classification).  Example
data follows the task: token ids [b, seq] with next-token targets for language models (seq2seq
models also get an all-ones attention mask and decoder ids), images [b, 3, size, size] with class
targets for image classifiers.  seq is the config's context (max_position_embeddings / n_positions,
512 where it has none) unless the overrides set `seq`; `batch` sets the example batch (default 8);
any other override replaces a config field (num_hidden_layers=4)."""
from __future__ import annotations

import contextlib
import json
import math

from ..errors import SappError
from .data import DataSpec, class_loss, token_loss

AUTO = ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForMaskedLM", "AutoModelForImageClassification")
DEFAULT_SEQ = 512


class HFConfigError(SappError):
    """A Hugging Face config sapp cannot build a model from."""


def load_config(path: str, overrides: dict, raw: bytes | None = None):
    """transformers' config for the file at `path`, or for `raw`, its bytes as the caller read them."""
    from ..fileio import SpecialFileError, read_regular
    try:
        raw = json.loads(read_regular(path, 64 << 20) if raw is None else raw)
    except SpecialFileError as e:
        raise HFConfigError(f"HF config {e}; pass the path of a config.json") from None
    except FileNotFoundError:
        raise HFConfigError(f"HF config {path} not found; pass the path of a config.json") from None
    except (OSError, ValueError) as e:
        raise HFConfigError(f"HF config {path} is not readable JSON ({type(e).__name__}); pass a config.json") from None
    except RecursionError:
        raise HFConfigError(f"HF config {path} nests deeper than JSON's reader allows; pass a config.json") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise HFConfigError(f"HF config {path} has no model_type; give a transformers config.json (e.g. \"model_type\": \"llama\")")
    check_sizes(path, raw)
    try:
        import transformers
    except ImportError:
        raise HFConfigError("--hf-config needs transformers: pip install transformers") from None
    raw = dict(raw, **{k: v for k, v in overrides.items() if k not in ("seq", "batch")})
    raw["use_cache"] = False          # a KV cache is for generation; training graphs have none
    mt = raw.pop("model_type")
    try:
        return transformers.AutoConfig.for_model(mt, **raw)
    except (ValueError, KeyError) as e:
        raise HFConfigError(f"HF config {path}: model_type {mt!r} is not known to transformers "
                            f"{transformers.__version__} ({_first_line(e)}); use a supported "
                            "architecture or pass your own factory with --model pkg.module:factory") from None
    except Exception as e:        # noqa: BLE001 - transformers' own field validation (huggingface_hub's
        raise HFConfigError(f"HF config {path}: transformers refuses it ({type(e).__name__}: "   # strict dataclasses)
                            f"{_first_line(e)}); fix that field") from None


def _first_line(e) -> str:
    return " ".join(str(e).split())[:120]


# Sizes the capture multiplies into shapes: positive integers, bounded so that a shape's element count
# stays far inside int64 (a 1e9 context overflowed torch's storage arithmetic at batch 4 x 32 heads).
SIZE_FIELDS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
               "num_key_value_heads", "head_dim", "n_embd", "n_head", "n_layer", "n_inner", "d_model",
               "num_layers", "num_heads", "d_ff", "d_kv", "encoder_layers", "decoder_layers",
               "encoder_attention_heads", "decoder_attention_heads", "num_labels", "image_size", "patch_size",
               "num_channels", "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size")
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len")
ZERO_OK = ("head_dim", "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
           "num_labels")            # 0: derived from the others, or no experts
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers")
MAX_LAYERS = 1 << 12      # the deepest published models have ~200; a million layers takes hours to build
MAX_SIZE = 1 << 24
MAX_CONTEXT = 1 << 20


def check_sizes(path: str, cfg: dict) -> None:
    """model_type a name and every size field a positive integer in bounds (the bounds of `sapp search`'s
    shapes), so a bad value is one line naming the field, never a traceback deep in transformers."""
    mt = cfg.get("model_type")
    if not isinstance(mt, str) or not mt.strip():
        raise HFConfigError(f"HF config {path}: model_type must be a name such as \"llama\", got {type(mt).__name__}")
    arch = cfg.get("architectures")
    if arch is not None and not (isinstance(arch, list) and all(isinstance(a, str) for a in arch)):
        raise HFConfigError(f"HF config {path}: architectures must be a list of class names such as "
                            f"[\"LlamaForCausalLM\"], got {type(arch).__name__}")
    for key in SIZE_FIELDS + CONTEXT_FIELDS:
        v = cfg.get(key)
        if v is None:
            continue
        top = MAX_CONTEXT if key in CONTEXT_FIELDS else MAX_LAYERS if key in LAYER_FIELDS else MAX_SIZE
        low = 0 if key in ZERO_OK else 1
        # per-stage / per-tower sizes are lists or objects of sizes (Swin's heads, LXMERT's layers)
        leaves = list(v.values()) if isinstance(v, dict) else v if isinstance(v, list) else [v]
        for x in leaves:
            ok = (not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) and x == int(x)
                  and low <= x <= top)
            if not ok:
                what = x if isinstance(x, (int, float)) and not isinstance(x, bool) else type(x).__name__
                hint = " (the sequence sapp trains at: set the training context)" if key in CONTEXT_FIELDS else ""
                raise HFConfigError(f"HF config {path}: {key} must be an integer from {low} to {top}{hint}, got {what}")


def model_class(cfg):
    import transformers
    for name in getattr(cfg, "architectures", None) or ():
        cls = getattr(transformers, name, None)
        if cls is not None and any(name.endswith(s) for s in ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration",
                                                            "ForMaskedLM", "ForImageClassification")):
            return cls
    for auto in AUTO:
        mapping = getattr(transformers, auto)._model_mapping
        try:
            return mapping[type(cfg)]
        except KeyError:
            continue
    raise HFConfigError(f"model_type {cfg.model_type!r} has no causal-LM, seq2seq, masked-LM or image-classification "
                        "class in transformers; pass your own factory with --model pkg.module:factory")


def build(path: str, device="meta", raw: bytes | None = None, **overrides):
    """(module, DataSpec, facts) for the config at `path` (built from `raw`, its bytes, when given)."""
    import torch
    cfg = load_config(path, overrides, raw)
    cls = model_class(cfg)
    try:
        with torch.device(device):
            model = cls(cfg)
    except Exception as e:        # noqa: BLE001 - a config transformers itself rejects
        raise HFConfigError(f"HF config {path}: {cls.__name__} could not be built ({type(e).__name__}: "
                            f"{' '.join(str(e).split())[:120]}); fix the config") from None
    batch = int(overrides.get("batch", 8))
    data, seq = _data(cls.__name__, cfg, batch, device, overrides.get("seq"))
    if seq is not None:
        _check_positions(model, seq, path)
    facts = {"source": "hf-config", "model_type": cfg.model_type, "class": cls.__name__, "s": seq}
    return model, data, facts


def _check_positions(model, seq, path):
    """A learned position table (an Embedding named for positions) shorter than the sequence: every
    token past its rows would index outside it, which meta tensors do not notice and a real step does."""
    import torch.nn as nn
    for name, mod in model.named_modules():
        leaf = name.rpartition(".")[2].lower()
        if isinstance(mod, nn.Embedding) and ("pos" in leaf or leaf == "wpe") and mod.num_embeddings < seq:
            raise HFConfigError(f"HF config {path}: sequence {seq} is longer than the learned position table "
                                f"{name} ({mod.num_embeddings} rows); pass --seq {mod.num_embeddings} or less")


def _seq(cfg, seq):
    if seq is not None:
        return int(seq)
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return DEFAULT_SEQ


def _ids(high, shape, device, seed):
    import torch
    if str(device) == "meta":
        return torch.empty(shape, dtype=torch.long, device="meta")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g).to(device)


def _data(clsname, cfg, b, device, seq):
    import torch
    if clsname.endswith("ForImageClassification"):
        size, ch = int(getattr(cfg, "image_size", 224)), int(getattr(cfg, "num_channels", 3))
        if str(device) == "meta":
            x = torch.empty((b, ch, size, size), device="meta")
        else:
            x = torch.randn((b, ch, size, size), generator=torch.Generator().manual_seed(1)).to(device)
        return DataSpec((x,), _ids(int(cfg.num_labels), (b,), device, 3), class_loss), None
    s = _seq(cfg, seq)
    V = int(cfg.vocab_size)
    ids = _ids(V, (b, s), device, 1)
    if getattr(cfg, "is_encoder_decoder", False):
        mask = torch.ones((b, s), dtype=torch.long, device=device)
        return DataSpec((ids, mask, _ids(V, (b, s), device, 2)), _ids(V, (b, s), device, 3), token_loss), s
    return DataSpec((ids,), _ids(V, (b, s), device, 3), token_loss), s


@contextlib.contextmanager
def eager_masks(model, inputs, kwargs=None):
    """Trace an HF decoder with the attention masks its eager forward uses.

    Called with input ids alone (sapp's example data: no attention mask, no position ids), an HF
    decoder in eager mode finds no padding and no packed sequences (its positions are an arange) and
    skips the causal mask: SDPA runs with is_causal=True and no mask, and with grouped-query
    attention on k/v as they are (enable_gqa) instead of repeat_kv's copies (transformers'
    masking_utils._ignore_causal_mask_sdpa, find_packed_sequence_indices; integrations/sdpa_attention).
    Under torch.export both decisions are refused on purpose (a traced graph must not hard-code them
    for other inputs), so a capture would see a materialised s x s mask, a non-causal attention over the
    whole s^2 and 16x copies of k and v (Llama-3-405B) that the program never runs.  sapp's graph and
    its pipeline stages are traced for exactly these example shapes and no padding, so inside this
    context the two export guards answer as eager does.  Nothing is patched for other models, for
    inputs beyond the ids (a mask or position ids decide for themselves), or without transformers."""
    import sys
    mu = sys.modules.get("transformers.masking_utils")
    patch = (mu is not None and _is_hf(model) and len(tuple(inputs)) == 1 and not (set(kwargs or {}) - {"target"})
             and hasattr(mu, "is_torchdynamo_exporting") and hasattr(mu, "find_packed_sequence_indices"))
    if not patch:
        yield
        return
    saved = (mu.is_torchdynamo_exporting, mu.find_packed_sequence_indices)
    mu.is_torchdynamo_exporting = lambda: False
    mu.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        mu.is_torchdynamo_exporting, mu.find_packed_sequence_indices = saved


def _is_hf(model) -> bool:
    import sys
    tf = sys.modules.get("transformers")
    base = getattr(tf, "PreTrainedModel", None) if tf is not None else None
    return base is not None and isinstance(model, base)
