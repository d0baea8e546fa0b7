"""Context parallelism for Hugging Face models: their attention modules call whatever function
transformers' attention interface names in `config._attn_implementation` (Llama, Qwen2, Mistral,
GPT-NeoX, ... in transformers 5), so cp registers one more implementation, "sapp_cp", and points the
model's config at it.  It receives each layer's q, k, v after the projections and rotary embeddings
(k, v un-repeated under grouped-query attention: what is gathered and priced), all-gathers k and v
over the cp group and attends as the model's own implementation would:
- "sdpa" (the default of HF models) or a flash kernel: fused attention per local chunk
  (sapp/emit/cp/cp_attention.py), the kernel sapp prices for an `attention` operator;
- "eager": the model file's own `eager_attention_forward` on the gathered keys with an additive mask
  of global positions, so the ops and the saved s² terms are those the capture priced.

Positions: the model's forward gets `position_ids` = this rank's tokens' global positions (rotary or
learned embeddings then see the right positions).  The causal mask is built here from positions;
transformers builds none for an implementation it has no mask function for.  Refused with a
PlanError, never run differently: a padding mask, a sliding window shorter than the sequence, a model
whose forward takes no position_ids, and (checked on the first step) an attention module that never
called the interface."""
from __future__ import annotations

import inspect
import sys

import torch

from ...errors import PlanError
from .cp_attention import Layout, fused_attention, gather_kv

NAME = "sapp_cp"


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    lay = getattr(module, "_sapp_cp", None)
    if lay is None:
        raise PlanError(f"{type(module).__name__} runs the cp attention but was not prepared for it; emit the "
                        f"model through sapp.emit")
    if attention_mask is not None:
        raise PlanError("context parallelism runs causal attention over whole sequences without a padding "
                        "mask; call the model without attention_mask (pack sequences instead)")
    module._sapp_cp_calls = getattr(module, "_sapp_cp_calls", 0) + 1
    _check_window(module, key.shape[2] * lay.cp)
    causal = bool(getattr(module, "is_causal", True))
    k, v = gather_kv(key, lay), gather_kv(value, lay)
    eager = getattr(module, "_sapp_cp_eager", None)
    if eager is not None:
        t = query.shape[2]
        mask = None
        if causal:
            dt = next(module.parameters()).dtype
            mask = torch.zeros(lay.allowed(t, query.device).shape, dtype=dt, device=query.device)
            mask = mask.masked_fill(~lay.allowed(t, query.device), torch.finfo(dt).min)[None, None]
        return eager(module, query, k, v, mask, scaling=scaling, dropout=dropout)
    y = fused_attention(query, k, v, lay, causal=causal, scale=scaling, dropout_p=dropout)
    return y.transpose(1, 2).contiguous(), None


def _check_window(module, seq):
    """A sliding window shorter than the sequence is not full causal attention: refused."""
    cfg = module.config
    window = getattr(module, "sliding_window", None) or getattr(cfg, "sliding_window", None)
    if window and getattr(cfg, "use_sliding_window", True) is not False and window < seq:
        raise PlanError(f"{type(module).__name__} attends within a sliding window of {window} < {seq} tokens; cp "
                        f"emits full causal attention only: drop cp or use sequences of at most {window}")


def _register():
    from transformers import AttentionInterface
    AttentionInterface.register(NAME, _attention)


def _position_host(model):
    """The outermost module whose forward takes position_ids (an HF *ForCausalLM, or its base model)."""
    for m in model.modules():
        if getattr(m, "config", None) is None:
            continue
        try:
            if "position_ids" in inspect.signature(m.forward).parameters:
                return m
        except (TypeError, ValueError):
            continue
    return None


def _attention_modules(model):
    """Modules that call the attention interface: HF attention classes hold the config and a layer
    index or a scaling (checked again at runtime: each must call it)."""
    out = []
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation") and type(m).__name__.endswith("Attention") \
                and (hasattr(m, "scaling") or hasattr(m, "layer_idx")):
            out.append(m)
    return out


def apply(model, lay: Layout) -> int:
    """Point an HF model's attention at the cp implementation; returns the attention modules prepared
    (0: not an HF model of that form)."""
    mods = _attention_modules(model)
    if not mods:
        return 0
    host = _position_host(model)
    if host is None:
        raise PlanError(f"cp needs the tokens' global positions, but {type(model).__name__}'s forward takes no "
                        f"position_ids; drop cp")
    _register()
    impls = {id(m.config): m.config._attn_implementation for m in mods}      # before any is changed
    for m in mods:
        cfg = m.config
        impl = impls[id(cfg)]
        if impl == NAME:
            raise PlanError(f"{type(model).__name__} was already prepared for cp; emit a fresh model")
        m._sapp_cp, m._sapp_cp_impl = lay, impl
        if impl == "eager":
            eager = getattr(sys.modules[type(m).__module__], "eager_attention_forward", None)
            if eager is None:
                raise PlanError(f"{type(m).__name__} uses eager attention but its module has no "
                                f"eager_attention_forward to run on the gathered keys; use attn_implementation='sdpa'")
            m._sapp_cp_eager = eager
        cfg._attn_implementation = NAME

    def positions(mod, args, kwargs):
        x = next((a for a in list(args) + list(kwargs.values()) if torch.is_tensor(a) and a.dim() >= 2), None)
        if x is None:
            raise PlanError(f"cp: {type(mod).__name__} was called without token ids to place")
        kwargs["position_ids"] = lay.positions(x.shape[1], x.device)[None]
        return args, kwargs

    host.register_forward_pre_hook(positions, with_kwargs=True)
    return len(mods)


def check_ran(modules) -> None:
    """After the first forward: every prepared attention module ran through the cp implementation."""
    for root in modules:
        for name, m in root.named_modules():
            if getattr(m, "_sapp_cp_impl", None) is not None and not getattr(m, "_sapp_cp_calls", 0):
                raise PlanError(f"cp: attention module {name} did not call transformers' attention interface, so "
                                f"it would attend over local tokens only; drop cp for this model")
