"""The architecture an engine must build to train the model sapp priced: sizes, norm, activation,
position embedding and its scaling, attention window, biases, tying and the MoE layer, read from the
plan's model section (a zoo config; for a Hugging Face config, the config.json the plan names, read
through transformers' config class: sapp/engines/arch_hf.py, whose FIELDS classifies every field) and checked
against the parameter count captured when the plan was priced (`meta["params"]`): an engine's file
that would build another model is refused, never written.

    a = architecture(plan["model"]["name"], meta, layers)   # dict, or None: sapp does not know it
    count(a), count(a, active=True)                          # the parameters an engine builds

`count` is the Megatron-Core GPT model's parameter count (embedding, position table when learned,
per layer: two norms, q/k/v and output projections, the MLP or the routed and shared experts with
the router; final norm; the output layer when untied)."""
from __future__ import annotations

import json

from .arch_hf import refuse_type
from .mapping import EngineError


def architecture(name: str, meta: dict, layers: int) -> dict | None:
    """The model's architecture (see the module doc), or None where sapp does not know it (a factory
    model).  Raises EngineError when the facts disagree with the priced model, or when the plan's
    model section is not what sapp wrote (a hand-edited plan: one line, never a traceback)."""
    cfg = meta.get("config") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or not isinstance(cfg or {}, dict):
        what = "model.meta" if not isinstance(meta, dict) else "model.meta.config"
        bad = meta if not isinstance(meta, dict) else cfg
        raise EngineError(f"the plan's {what} is {type(bad).__name__}, not an object of the model's settings; "
                          "search the plan again (or restore the section sapp wrote)")
    try:
        a = _settings(name, meta.get("kind"), dict(cfg or {}), meta)
        if a is None:
            return None
        built = count(a)
    except EngineError:
        raise
    except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as e:
        why = f"{type(e).__name__}: {str(e)[:80]}"
        raise EngineError(f"the plan's model.meta.config does not describe a {str(meta.get('kind'))[:40]} model "
                          f"({why}); search the plan again (or restore the section sapp wrote)") from None
    if a["layers"] != layers:
        raise EngineError(f"the model states {a['layers']} layers but sapp priced {layers} blocks; search the plan "
                          f"again for this model")
    priced = meta.get("params")
    if isinstance(priced, (int, float)) and not isinstance(priced, bool) and priced and built != priced:
        raise EngineError(f"{name}: the architecture an engine would build has {built:,} parameters, the priced "
                          f"model {priced:,}; search the plan again for this model (or export to deepspeed, which "
                          f"trains your own module)")
    return a


def _settings(name: str, kind, c: dict, meta: dict):
    """The architecture dict of a zoo or HF config `c` of `kind`, or None for a kind sapp does not know."""
    seq = meta.get("seq") or c.get("s")
    if kind == "gpt":
        a = dict(layers=c["l"], hidden=c["h"], heads=c["a"], kv_heads=c["a"], head_dim=c["h"] // c["a"],
                 ffn=c.get("ffn") or 4 * c["h"], vocab=c["V"], seq=seq, max_pos=c["s"], norm="LayerNorm",
                 norm_eps=1e-5, glu=False, act="gelu", position="learned_absolute", rope_base=None, bias=True,
                 qkv_bias=True, tied=bool(c.get("tie_embeddings")))
    elif kind == "llama":
        a = dict(layers=c["l"], hidden=c["h"], heads=c["a"], kv_heads=c["kv"], head_dim=c["h"] // c["a"],
                 ffn=c["ffn"], vocab=c["V"], seq=seq, max_pos=c["s"], norm="RMSNorm", norm_eps=c.get("eps", 1e-5),
                 glu=True, act="silu", position="rope", rope_base=c.get("theta", 500000.0), bias=False, qkv_bias=False,
                 tied=False)
    elif kind == "moe":
        a = dict(layers=c["l"], hidden=c["h"], heads=c["a"], kv_heads=c["kv"], head_dim=c.get("hd") or c["h"] // c["a"],
                 ffn=c["ffn"], vocab=c["V"], seq=seq, max_pos=c["s"], norm="RMSNorm", norm_eps=c.get("eps", 1e-6),
                 glu=True, act="silu", position="rope", rope_base=c.get("theta"), bias=False, qkv_bias=False, tied=False,
                 experts=c["experts"],
                 top_k=c["top_k"], expert_ffn=c["expert_ffn"], shared_ffn=c.get("shared", 0) * c["expert_ffn"],
                 dense_layers=c.get("dense", 0))
        if c.get("capacity_factor"):
            a["capacity_factor"] = c["capacity_factor"]
    elif kind == "hf":
        a = _hf(name, c, seq)
    else:
        return None
    return a


def _hf(path: str, facts: dict, seq) -> dict:
    from ..fileio import read_regular
    from .arch_hf import read
    mt = facts.get("model_type")
    refuse_type(mt)
    try:
        raw = json.loads(read_regular(path, 64 << 20))
    except (OSError, ValueError) as e:
        raise EngineError(f"cannot read the plan's HF config {path} ({type(e).__name__}); export where the "
                          f"config.json the plan was searched with is") from None
    if not isinstance(raw, dict) or raw.get("model_type") != mt:
        raise EngineError(f"{path} is not the {mt} config the plan was searched with; export beside that file")
    return read(path, raw, seq)


def count(a: dict, active: bool = False) -> int:
    """Parameters of the GPT model an engine builds from `a` (active: top_k routed experts per MoE
    layer, what one token meets)."""
    h, hd, ffn = a["hidden"], a["head_dim"], a["ffn"]
    norm = 2 * h if a["norm"] == "LayerNorm" else h
    qkv = h * (a["heads"] + 2 * a["kv_heads"]) * hd
    attn = qkv + a["heads"] * hd * h + 2 * norm
    if a.get("qk_norm"):            # one norm over a head's width for queries, one for keys (shared by heads)
        attn += 2 * (norm // h) * hd
    if a["qkv_bias"]:
        attn += (a["heads"] + 2 * a["kv_heads"]) * hd
    if a["bias"]:
        attn += h
    if a.get("mla"):
        from .arch_mla import attention_params
        attn = attention_params(a, norm // h)

    def mlp(f):
        n = (3 if a["glu"] else 2) * h * f
        if a["bias"]:
            n += f * (2 if a["glu"] else 1) + h
        return n
    L = a["layers"]
    if a.get("experts"):
        E, dense = a["experts"], a.get("dense_layers", 0)
        routed = (a["top_k"] if active else E) * mlp(a["expert_ffn"])
        moe = h * E + routed + (mlp(a["shared_ffn"]) if a.get("shared_ffn") else 0) + (h if a.get("shared_gate") else 0)
        layers = L * attn + dense * mlp(ffn) + (L - dense) * moe
    else:
        layers = L * (attn + mlp(ffn))
    emb = a["vocab"] * h + (a["max_pos"] * h if a["position"] == "learned_absolute" else 0)
    return layers + emb + norm + (0 if a["tied"] else a["vocab"] * h)
