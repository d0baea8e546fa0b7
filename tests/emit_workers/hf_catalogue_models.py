"""Every architecture of transformers' auto mappings as a tiny model: the default config shrunk by one
generic rule over common attribute names (2 layers, width 64, 4 heads, FFN 128, vocab 256, dropout 0),
no download.  A kind is "cat:<model_type>" (the class: the first of seq2seq LM, causal LM, masked LM,
image classification that maps it); tests/emit_workers/hf_models.py hands such kinds here, so the
emission harness (hf_harness, hf_plans) runs them like its own.  `skip_reason` names what cannot be
built offline or tiny."""
from __future__ import annotations

import functools
import inspect

import torch

from tests.emit_workers.hf_models import _ce    # the same loss as the matrix's models

SEQ, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, IMAGE, LABELS = 16, 64, 2, 4, 2, 16, 128, 256, 64, 10
TASKS = ("seq2seq", "causal", "masked", "image")      # an encoder-decoder type is its full model
_MAPPINGS = {"causal": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "masked": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
             "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
             "image": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"}

# attribute name -> shrunk value (ints only shrink: a default already smaller is kept)
_LAYERS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
           "num_decoder_layers", "num_encoder_layers", "n_layers_per_block", "num_text_layers")
_WIDTH = ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "model_dim", "embedding_size", "d_embed",
          "word_embed_proj_dim", "projection_dim", "emb_dim", "text_hidden_size")
_HEADS = ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads", "decoder_attention_heads",
          "n_heads", "num_attention_heads_per_layer")
_KV = ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num", "n_kv_heads")
_HEAD_DIM = ("head_dim", "d_kv", "kv_channels", "attention_head_size", "qk_nope_head_dim", "v_head_dim",
             "qk_rope_head_dim", "d_head")
_FFN = ("intermediate_size", "d_ff", "n_inner", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "ffn_hidden_size",
        "moe_intermediate_size", "shared_expert_intermediate_size", "d_inner", "inner_hidden_size",
        "ffn_inner_hidden_size", "expert_intermediate_size", "mlp_dim", "dim_feedforward")
_POSITIONS = ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length", "n_ctx",
              "max_source_positions", "max_target_positions", "seq_length")
_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOPK = ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts", "moe_k")
_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
              "cls_token_id", "mask_token_id", "unk_token_id", "image_token_id", "forced_eos_token_id")


def _shrink_int(d, names, value):
    for n in names:
        if isinstance(d.get(n), int) and not isinstance(d.get(n), bool) and d[n] > value:
            d[n] = value


def shrink(d: dict) -> dict:
    """Shrink a config's to_dict() in place (sub-config dicts too) and return it."""
    old_layers = next((d[n] for n in _LAYERS if isinstance(d.get(n), int) and not isinstance(d.get(n), bool)), None)
    _shrink_int(d, _LAYERS, LAYERS)
    _shrink_int(d, _WIDTH, HIDDEN)
    mha = {n for n in _KV if d.get(n) is not None and d.get(n) == next((d[h] for h in _HEADS if h in d), None)}
    _shrink_int(d, _HEADS, HEADS)
    _shrink_int(d, _KV, KV_HEADS)
    for n in mha:                # as many key/value heads as query heads stays so (MLA needs it)
        d[n] = d[next(h for h in _HEADS if h in d)]
    for n in _HEAD_DIM:
        if isinstance(d.get(n), int) and not isinstance(d.get(n), bool):
            d[n] = HEAD_DIM
    _shrink_int(d, _FFN, FFN)
    _shrink_int(d, ("rotary_dim", "rotary_emb_dim", "rope_dim", "rotary_ndims"), HEAD_DIM // 2)
    _shrink_int(d, ("vocab_size",), VOCAB)
    _shrink_int(d, _POSITIONS, 64)
    _shrink_int(d, _EXPERTS, 4)
    _shrink_int(d, _TOPK, 2)
    _shrink_int(d, ("image_size",), IMAGE)
    _shrink_int(d, ("patch_size",), 8)
    _shrink_int(d, ("window_size",), 2)
    _shrink_int(d, ("num_labels",), LABELS)
    for n in _TOKEN_IDS:         # special ids past the shrunk vocabulary
        v = d.get(n)
        if isinstance(v, int) and v >= VOCAB:
            d[n] = VOCAB - 1 - _TOKEN_IDS.index(n)
        elif isinstance(v, list):
            d[n] = [x if not isinstance(x, int) or x < VOCAB else VOCAB - 1 for x in v]
    for k, v in list(d.items()):
        # every random draw in training off, dropout's kin included (router / input jitter noise: a
        # pipeline's micro-batches draw it per micro-batch, one process per batch, so the comparison
        # with one process would differ by the draws, not by sapp: PhiMoE pp2 at 1.5e-4)
        # (per-stage lists too: CvT's drop_path_rate [0, 0, 0.1], stochastic depth in its last stage,
        # trained dp2 1.5e-1 off one process by the ranks' own masks)
        # (any "*drop*_rate": EfficientNet's drop_connect_rate 0.2 is an nn.Dropout of up to 0.2 in 48 of
        # its blocks: dp2 4.1e-5 off one process in float32, 6.0e-4 in float64, the masks not rounding)
        drawn = ("dropout" in k or "drop_prob" in k or k.endswith("pdrop") or k.endswith("_drop")
                 or ("drop" in k and k.endswith("rate")) or "jitter" in k or "layerdrop" in k)
        if drawn and isinstance(v, float):
            d[k] = 0.0
        elif drawn and isinstance(v, list) and v and all(isinstance(x, float) for x in v):
            d[k] = [0.0] * len(v)
        elif isinstance(v, dict) and v and all(str(x).isdigit() for x in v):
            d[k] = {x: y for x, y in v.items() if int(x) < LAYERS}     # per-layer settings by layer index
        elif isinstance(v, dict) and ("model_type" in v or k.endswith("_config")):
            shrink(v)
        elif isinstance(v, list) and old_layers and len(v) == old_layers and old_layers > LAYERS:
            d[k] = v[:LAYERS]     # per-layer lists (layer_types, ...) follow the layer count
    # staged vision models: one block a stage, widths 16..64
    if isinstance(d.get("depths"), list):
        d["depths"] = [1] * len(d["depths"])
    for n in ("hidden_sizes", "embed_dims", "hidden_dims"):
        if isinstance(d.get(n), list):
            d[n] = [min(int(v), 16 * 2 ** min(i, 2)) for i, v in enumerate(d[n])]
    for n in ("num_heads", "num_attention_heads"):
        if isinstance(d.get(n), list):
            d[n] = [min(int(v), 2) for v in d[n]]
    for n in ("out_features", "out_indices", "stage_names"):     # a backbone's stage picks follow the depth
        d.pop(n, None)
    if "use_cache" in d:
        d["use_cache"] = False
    return d


@functools.lru_cache(maxsize=None)
def catalogue() -> dict:
    """{model_type: (task, class name)} over the four mappings, each model type once (its first task)."""
    from transformers.models.auto import modeling_auto
    out = {}
    for task in TASKS:
        for mt, cls in getattr(modeling_auto, _MAPPINGS[task]).items():
            out.setdefault(mt, (task, cls[0] if isinstance(cls, (list, tuple)) else cls))
    return dict(sorted(out.items()))


def _config(model_type: str):
    from transformers import CONFIG_MAPPING
    base = CONFIG_MAPPING[model_type]()
    d = shrink(base.to_dict())
    if catalogue()[model_type][0] == "causal" and d.get("is_decoder") is False and not d.get("is_encoder_decoder"):
        d["is_decoder"] = True             # an encoder type's causal-LM head (BertLMHeadModel, Reformer)
    cfg = type(base).from_dict(d)
    for c in [cfg] + [getattr(cfg, a) for a in dir(cfg) if a.endswith("_config") and not a.startswith("_")
                      and hasattr(getattr(cfg, a, None), "to_dict")]:
        try:
            c._attn_implementation = "eager"
        except Exception:           # noqa: BLE001 - some sub-configs refuse the setting: their default stands
            pass
    return cfg


class Named(torch.nn.Module):
    """An HF model called positionally by its input names (encoder ids + decoder ids, features, ...)."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, tuple(names)

    def forward(self, *args):
        return self.model(**dict(zip(self.names, args)))


def _input_names(cls, cfg) -> tuple:
    main = getattr(cls, "main_input_name", "input_ids")
    if getattr(cfg, "is_encoder_decoder", False):
        return (main, "decoder_input_ids")
    return (main,)


def _class(model_type):
    import transformers
    task, name = catalogue()[model_type]
    return task, getattr(transformers, name)


def _make(model_type):
    task, cls = _class(model_type)
    cfg = _config(model_type)
    model = cls(cfg)
    names = _input_names(cls, cfg)
    first = next(iter(inspect.signature(model.forward).parameters), None)
    return (model if names == (first,) else Named(model, names)), names, cfg, task


def _mt(kind: str) -> str:
    return kind[len("cat:"):]


def build(kind: str, seed: int = 0, device="cpu"):
    """(model in train mode, loss_fn(out, target)) with weights from `seed`."""
    torch.manual_seed(seed)
    with torch.device(device):
        m = _make(_mt(kind))[0]
    return m.train(), _ce


@functools.lru_cache(maxsize=None)
def _shape_info(kind):
    """(input names, task, vocab, channels, image size, mel bins, frames) of a kind, from its config."""
    task, cls = _class(_mt(kind))
    cfg = _config(_mt(kind))
    names = _input_names(cls, cfg)
    vcfg = getattr(cfg, "vision_config", None) or cfg
    text = getattr(cfg, "text_config", None) or getattr(cfg, "decoder", None) or cfg
    vocab = getattr(text, "vocab_size", None) or getattr(cfg, "vocab_size", None) or VOCAB
    img = getattr(vcfg, "image_size", IMAGE)
    img = img[0] if isinstance(img, (list, tuple)) else img
    return (names, task, int(vocab), int(getattr(vcfg, "num_channels", 3)), int(img),
            int(getattr(cfg, "num_mel_bins", 0) or 0), 2 * int(getattr(cfg, "max_source_positions", SEQ) or SEQ),
            int(getattr(cfg, "num_labels", LABELS)))


def batch(kind: str, b: int, step: int):
    """(inputs tuple, targets) for step `step`: fresh seeded data each step."""
    names, task, vocab, ch, img, mels, frames, labels = _shape_info(kind)
    g = torch.Generator().manual_seed(2000 + step)
    ins = []
    for n in names:
        if n == "pixel_values":
            ins.append(torch.randn(b, ch, img, img, generator=g))
        elif n == "input_features":
            ins.append(torch.randn(b, mels, frames, generator=g))
        elif n in ("input_ids", "decoder_input_ids"):
            ins.append(None)
        else:
            raise ValueError(f"input {n!r} is not synthesised")
    if task == "image" and "pixel_values" in names:
        return tuple(ins), torch.randint(0, labels, (b,), generator=g)
    ids = torch.randint(1, vocab, (b, SEQ + 1), generator=g)
    if task == "image":                      # an image classifier over token ids (ImageGPT's colour clusters)
        return (ids[:, :-1],), torch.randint(0, labels, (b,), generator=g)
    if len(names) > 1:                       # encoder input + decoder ids; targets: decoder ids shifted
        dec = torch.randint(1, vocab, (b, SEQ + 1), generator=g)
        ins = [ids[:, :-1] if x is None and n == "input_ids" else x for n, x in zip(names, ins)]
        ins[names.index("decoder_input_ids")] = dec[:, :-1]
        return tuple(ins), dec[:, 1:]
    return (ids[:, :-1],), ids[:, 1:]


def skip_reason(kind: str) -> str | None:
    """Why a kind cannot be built offline and tiny (None: it can): read from its class and config."""
    names, task, *_ = _shape_info(kind)
    for n in names:
        if n not in ("pixel_values", "input_features", "input_ids", "decoder_input_ids"):
            return f"input {n!r} is not synthesised"
    return None
