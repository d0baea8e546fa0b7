"""Tiny Hugging Face models built from configs (no download): 2 layers, hidden 64, seq 16, dropout 0.

One builder per architecture of issue #13's matrix; `build(kind)` gives (model, loss_fn), `batch(kind,
b, step)` a seeded global batch, `reference(kind, steps, b)` single-process Adam training losses.
`llama_padded` is Llama called with an attention_mask (right padding, 0-3 tokens per row): its
mask is built from that input, so it is data a pipeline must send (sapp/pipeline/boundary.py)."""
from __future__ import annotations

import contextlib

import torch
from torch.nn import functional as F

SEQ, HIDDEN, LAYERS, HEADS, VOCAB, FFN, MELS = 16, 64, 2, 4, 256, 128, 8
KINDS = ("llama", "mistral", "qwen2", "gpt_neox", "bert", "vit", "t5", "mixtral",      # + llama_padded
         "opt", "stablelm", "distilbert", "whisper")


def _decoder(cls_cfg, cls_model, **extra):
    cfg = cls_cfg(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=64,
                  use_cache=False, attention_dropout=0.0, tie_word_embeddings=False, **extra)
    cfg._attn_implementation = "eager"
    return cls_model(cfg)


def _make(kind):
    import transformers as T
    if kind in ("llama", "llama_padded"):
        return _decoder(T.LlamaConfig, T.LlamaForCausalLM)
    if kind == "mistral":
        return _decoder(T.MistralConfig, T.MistralForCausalLM, sliding_window=None)
    if kind == "qwen2":
        return _decoder(T.Qwen2Config, T.Qwen2ForCausalLM)
    if kind == "mixtral":
        return _decoder(T.MixtralConfig, T.MixtralForCausalLM, num_local_experts=4, num_experts_per_tok=2,
                        router_jitter_noise=0.0)
    if kind == "gpt_neox":
        cfg = T.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                              num_attention_heads=HEADS, max_position_embeddings=64, use_cache=False,
                              hidden_dropout=0.0, attention_dropout=0.0, tie_word_embeddings=False)
        cfg._attn_implementation = "eager"
        return T.GPTNeoXForCausalLM(cfg)
    if kind == "bert":
        cfg = T.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
        cfg._attn_implementation = "eager"
        return T.BertForMaskedLM(cfg)
    if kind == "vit":
        cfg = T.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=HIDDEN, intermediate_size=FFN,
                          num_hidden_layers=LAYERS, num_attention_heads=HEADS, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0, num_labels=10)
        cfg._attn_implementation = "eager"
        return T.ViTForImageClassification(cfg)
    if kind == "t5":
        cfg = T.T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=FFN, num_layers=LAYERS,
                         num_decoder_layers=LAYERS, num_heads=HEADS, dropout_rate=0.0, use_cache=False,
                         decoder_start_token_id=0, pad_token_id=0, tie_word_embeddings=False)
        return Seq2Seq(T.T5ForConditionalGeneration(cfg))
    if kind == "opt":       # attention views by its stored head count: view(bsz, -1, self.num_heads, hd)
        cfg = T.OPTConfig(vocab_size=VOCAB, hidden_size=HIDDEN, ffn_dim=FFN, num_hidden_layers=LAYERS,
                          num_attention_heads=HEADS, max_position_embeddings=64, word_embed_proj_dim=HIDDEN,
                          dropout=0.0, attention_dropout=0.0, layerdrop=0.0, use_cache=False,
                          tie_word_embeddings=False)
        cfg._attn_implementation = "eager"
        return T.OPTForCausalLM(cfg)
    if kind == "stablelm":  # partial rotary; views by self.num_heads / num_key_value_heads
        cfg = T.StableLmConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                               num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=64,
                               hidden_dropout=0.0, attention_dropout=0.0, use_cache=False, tie_word_embeddings=False)
        cfg._attn_implementation = "eager"
        return T.StableLmForCausalLM(cfg)
    if kind == "distilbert":    # learned position embeddings added after the word embedding
        cfg = T.DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, hidden_dim=FFN, n_layers=LAYERS, n_heads=HEADS,
                                 max_position_embeddings=64, dropout=0.0, attention_dropout=0.0)
        cfg._attn_implementation = "eager"
        return T.DistilBertForMaskedLM(cfg)
    if kind == "whisper":       # encoder features + decoder ids; frozen sinusoidal encoder positions
        cfg = T.WhisperConfig(vocab_size=VOCAB, num_mel_bins=MELS, d_model=HIDDEN, encoder_layers=LAYERS,
                              decoder_layers=LAYERS, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                              encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, max_source_positions=SEQ // 2,
                              max_target_positions=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                              encoder_layerdrop=0.0, decoder_layerdrop=0.0, use_cache=False,
                              decoder_start_token_id=0, pad_token_id=0, tie_word_embeddings=False)
        cfg._attn_implementation = "eager"
        return Speech2Text(T.WhisperForConditionalGeneration(cfg))
    raise ValueError(f"unknown model kind {kind!r}; one of {', '.join(KINDS)}")


class Seq2Seq(torch.nn.Module):
    """T5 called positionally as (encoder ids, decoder ids): its own forward takes attention_mask second."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, decoder_input_ids):
        return self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids)


class Speech2Text(torch.nn.Module):
    """Whisper called positionally as (input features, decoder ids)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_features, decoder_input_ids):
        return self.model(input_features=input_features, decoder_input_ids=decoder_input_ids)


def _ce(out, y):
    out = out.logits if hasattr(out, "logits") else out
    return F.cross_entropy(wide(out.reshape(-1, out.shape[-1])), y.reshape(-1))


def wide(t):
    """`t` in at least float32 (half logits widened for the loss); a float64 run stays float64."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


@contextlib.contextmanager
def default_dtype(name: str | None):
    """Build models, batches and references in `name` ("float64": the harness's rounding-free
    re-run, where one process and a layout that only sums in another order agree to ~1e-12, so a
    difference left is a real one); None or "float32" keeps torch's default."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, name or "float32"))
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build(kind: str, seed: int = 0, device="cpu"):
    """(model in train mode, loss_fn(out, target)) with weights from `seed`."""
    if kind.startswith("cat:"):        # a catalogue architecture (bench/hf_catalogue.py)
        from tests.emit_workers import hf_catalogue_models
        return hf_catalogue_models.build(kind, seed, device)
    if kind.startswith("lib:"):        # another library's model (bench/lib_catalogue.py)
        from tests.emit_workers import lib_models
        return lib_models.build(kind, seed, device)
    torch.manual_seed(seed)
    with torch.device(device):
        m = _make(kind)
    return m.train(), _ce


def batch(kind: str, b: int, step: int):
    """(inputs tuple, targets) for step `step`: fresh seeded data each step."""
    if kind.startswith("cat:"):
        from tests.emit_workers import hf_catalogue_models
        return hf_catalogue_models.batch(kind, b, step)
    if kind.startswith("lib:"):
        from tests.emit_workers import lib_models
        return lib_models.batch(kind, b, step)
    g = torch.Generator().manual_seed(2000 + step)
    if kind == "vit":
        return (torch.randn(b, 3, 16, 16, generator=g),), torch.randint(0, 10, (b,), generator=g)
    ids = torch.randint(1, VOCAB, (b, SEQ + 1), generator=g)
    if kind == "llama_padded":     # row r ignores its last r % 4 tokens (as keys): a data-built mask
        keep = (torch.arange(SEQ) < SEQ - (torch.arange(b) % 4)[:, None]).long()
        return (ids[:, :-1], keep), ids[:, 1:]
    if kind == "whisper":  # log-mel-like features (2 x max_source_positions frames) and decoder ids
        feats = torch.randn(b, MELS, SEQ, generator=g)
        dec = torch.randint(1, VOCAB, (b, SEQ + 1), generator=g)
        return (feats, dec[:, :-1]), dec[:, 1:]
    if kind == "t5":       # encoder ids and decoder ids; targets: the decoder ids shifted by one
        dec = torch.randint(1, VOCAB, (b, SEQ + 1), generator=g)
        return (ids[:, :-1], dec[:, :-1]), dec[:, 1:]
    return (ids[:, :-1],), ids[:, 1:]


def reference(kind: str, steps: int, b: int, lr: float = 1e-3, params: dict | None = None) -> list:
    """Single-process full-batch Adam training: the losses every emitted plan must reproduce.
    `params`, if given, receives {name: [sum, sum of squares]} of every parameter after training."""
    m, loss_fn = build(kind)
    opt = torch.optim.Adam(m.parameters(), lr=lr)
    out = []
    for i in range(steps):
        x, y = batch(kind, b, i)
        loss = loss_fn(m(*x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    if params is not None:
        for n, p in m.named_parameters():
            d = p.detach().double()
            params[n] = [float(d.sum()), float((d * d).sum())]
    return out
