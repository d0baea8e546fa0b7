"""Popular PyTorch model libraries other than transformers, each model family built tiny (no weights):
x-transformers, vit-pytorch, tab-transformer-pytorch, perceiver-pytorch, performer-pytorch,
local-attention and x-mlps-pytorch (the `probe` extra, pinned in constraints.txt), torch.nn's own
Transformer / TransformerEncoder / LSTM, and nanoGPT's and litgpt's model files as their repositories
write them (tests/emit_workers/heads_models.py: neither is a package here).  A kind is "lib:<case>"; tests/emit_workers/hf_models.py
hands such kinds here, so the emission harness (hf_harness, hf_plans) runs them like its own and
bench/lib_catalogue.py runs them like the transformers catalogue.

Sizes follow the transformers catalogue: width 64, 2 layers, 4 heads, sequence 16, vocab 256, 16x16
images with 10 labels; every dropout and random draw during training is off (Performer's feature
redraw too), so one process is the exact reference.  The library's code is called as its README
shows; a wrapper only orders the inputs positionally (sapp's example inputs are a tuple)."""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import torch
from torch.nn import functional as F

from tests.emit_workers.hf_models import _ce, wide

SEQ, DIM, DEPTH, HEADS, VOCAB, IMAGE, LABELS, FEATURES = 16, 64, 2, 4, 256, 16, 10, 8
CATEGORIES, CONTINUOUS = (5, 7, 3, 4), 3


def _mse(out, y):
    return F.mse_loss(wide(out), y)


def _vit(name):
    """A vit_pytorch module: its package __init__ imports Dino, which needs torchvision (not installable
    beside this torch); the model files themselves need only torch and einops, so the package is
    entered without its __init__ when that import fails."""
    try:
        return importlib.import_module(f"vit_pytorch.{name}")
    except ImportError as e:
        if "torchvision" not in str(e):
            raise
    spec = importlib.util.find_spec("vit_pytorch")
    pkg = types.ModuleType("vit_pytorch")
    pkg.__path__, pkg.__spec__ = list(spec.submodule_search_locations), spec
    sys.modules["vit_pytorch"] = pkg
    return importlib.import_module(f"vit_pytorch.{name}")


class Seq2Seq(torch.nn.Module):
    """x-transformers' XTransformer as (source ids, target ids) -> logits: its own forward returns the
    autoregressive wrapper's loss; here the loss is the bench's, over the decoder's logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, src, tgt):
        enc = self.model.encoder(src, return_embeddings=True)
        return self.model.decoder.net(tgt, context=enc)


# ---- the cases: name -> (library, family, input kind, builder) -------------------------------------
def _xt(**attn):
    from x_transformers import Decoder, TransformerWrapper
    return TransformerWrapper(num_tokens=VOCAB, max_seq_len=SEQ,
                              attn_layers=Decoder(dim=DIM, depth=DEPTH, heads=HEADS, **attn))


def _xt_encoder():
    from x_transformers import Encoder, TransformerWrapper
    return TransformerWrapper(num_tokens=VOCAB, max_seq_len=SEQ, attn_layers=Encoder(dim=DIM, depth=DEPTH, heads=HEADS))


def _xt_vit():
    from x_transformers import Encoder, ViTransformerWrapper
    return ViTransformerWrapper(image_size=IMAGE, patch_size=4, num_classes=LABELS,
                                attn_layers=Encoder(dim=DIM, depth=DEPTH, heads=HEADS))


def _xt_encdec():
    from x_transformers import XTransformer
    return Seq2Seq(XTransformer(dim=DIM, enc_num_tokens=VOCAB, enc_depth=DEPTH, enc_heads=HEADS, enc_max_seq_len=SEQ,
                                dec_num_tokens=VOCAB, dec_depth=DEPTH, dec_heads=HEADS, dec_max_seq_len=SEQ,
                                tie_token_emb=False))


def _xt_continuous():
    from x_transformers import ContinuousTransformerWrapper, Encoder
    return ContinuousTransformerWrapper(dim_in=FEATURES, dim_out=FEATURES, max_seq_len=SEQ,
                                        attn_layers=Encoder(dim=DIM, depth=DEPTH, heads=HEADS))


_VIT = dict(image_size=IMAGE, num_classes=LABELS, dim=DIM, depth=DEPTH, heads=HEADS, mlp_dim=2 * DIM, dim_head=16)


def _vit_case(module, cls, **kw):
    def make():
        args = dict(_VIT)
        args.update(kw)
        return getattr(_vit(module), cls)(**{k: v for k, v in args.items() if v is not None})
    return make


def _tab(cls):
    def make():
        import tab_transformer_pytorch as T
        # TabTransformer's MLP head: its default activation (None) reaches x-mlps-pytorch as a layer
        extra = {"mlp_act": torch.nn.ReLU()} if cls == "TabTransformer" else {}
        return getattr(T, cls)(categories=CATEGORIES, num_continuous=CONTINUOUS, dim=DIM // 2, depth=DEPTH,
                               heads=HEADS, dim_out=1, attn_dropout=0.0, ff_dropout=0.0, **extra)
    return make


def _perceiver():
    from perceiver_pytorch import Perceiver
    return Perceiver(input_channels=3, input_axis=2, num_freq_bands=4, max_freq=10.0, depth=DEPTH, num_latents=16,
                     latent_dim=DIM, cross_heads=1, latent_heads=HEADS, cross_dim_head=16, latent_dim_head=16,
                     num_classes=LABELS, self_per_cross_attn=1)


def _perceiver_lm():
    from perceiver_pytorch.perceiver_io import PerceiverLM
    return PerceiverLM(num_tokens=VOCAB, dim=DIM, depth=DEPTH, max_seq_len=SEQ, num_latents=16, latent_dim=DIM,
                       cross_heads=1, latent_heads=HEADS, cross_dim_head=16, latent_dim_head=16)


def _performer(causal):
    def make():
        from performer_pytorch import PerformerLM
        return PerformerLM(num_tokens=VOCAB, max_seq_len=SEQ, dim=DIM, depth=DEPTH, heads=HEADS, dim_head=16,
                           causal=causal, nb_features=32, feature_redraw_interval=None)
    return make


def _local_transformer():
    import random
    from local_attention import LocalTransformer
    random.seed(0)      # hyper-connections picks each layer's residual stream with Python's random
    return LocalTransformer(num_tokens=VOCAB, max_seq_len=SEQ, dim=DIM, depth=DEPTH, heads=HEADS, dim_head=16,
                            local_attn_window_size=SEQ // 2, causal=True)


def _x_mlp():
    from x_mlps_pytorch import MLP
    return MLP(FEATURES, DIM, DIM, FEATURES)


def _nanogpt():
    from tests.emit_workers import heads_models as M
    return M.NanoGPT(M.GPTConfig(block_size=SEQ, vocab_size=VOCAB, n_embd=DIM, n_head=HEADS), dtype=torch.float32)


def _litgpt(cls):
    def make():
        from tests.emit_workers import heads_models as M
        cfg = M.Config(block_size=SEQ, padded_vocab_size=VOCAB, n_embd=DIM, n_head=HEADS, n_query_groups=2,
                       head_size=DIM // HEADS, intermediate_size=2 * DIM)
        return getattr(M, cls)(cfg, dtype=torch.float32)
    return make


class TorchEncoderLM(torch.nn.Module):
    """torch.nn's TransformerEncoder (nn.MultiheadAttention inside, pre-norm) as a causal LM."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.emb, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        layer = nn.TransformerEncoderLayer(DIM, HEADS, 2 * DIM, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, DEPTH, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
        x = self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return self.head(self.encoder(x, mask=mask, is_causal=True))


class TorchSeq2Seq(torch.nn.Module):
    """torch.nn.Transformer (encoder-decoder) between two token tables and a head."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.src, self.tgt = nn.Embedding(VOCAB, DIM), nn.Embedding(VOCAB, DIM)
        self.transformer = nn.Transformer(DIM, HEADS, DEPTH, DEPTH, 2 * DIM, dropout=0.0, batch_first=True)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, src, tgt):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
        return self.head(self.transformer(self.src(src), self.tgt(tgt), tgt_mask=mask, tgt_is_causal=True))


class LSTMLM(torch.nn.Module):
    """A two-layer torch.nn.LSTM language model (no container of blocks)."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(VOCAB, DIM), torch.nn.Linear(DIM, VOCAB)
        self.rnn = torch.nn.LSTM(DIM, DIM, num_layers=2, batch_first=True)

    def forward(self, ids):
        return self.head(self.rnn(self.emb(ids))[0])


NANOGPT, LITGPT = "nanoGPT model.py (reproduced)", "litgpt model.py (reproduced)"

CASES = {
    "xt_gpt": ("x-transformers", "decoder LM, absolute positions", "lm", _xt),
    "xt_llama": ("x-transformers", "decoder LM: rotary, RMSNorm, GQA, GLU", "lm",
                 lambda: _xt(rotary_pos_emb=True, use_rmsnorm=True, attn_kv_heads=2, ff_glu=True, ff_no_bias=True)),
    "xt_alibi": ("x-transformers", "decoder LM: ALiBi bias", "lm", lambda: _xt(alibi_pos_bias=True, alibi_num_heads=2)),
    "xt_bert": ("x-transformers", "encoder (masked-LM head)", "lm", _xt_encoder),
    "xt_vit": ("x-transformers", "ViT wrapper", "image", _xt_vit),
    "xt_encdec": ("x-transformers", "encoder-decoder (XTransformer)", "seq2seq", _xt_encdec),
    "xt_continuous": ("x-transformers", "continuous in/out", "cont", _xt_continuous),
    "vit": ("vit-pytorch", "ViT", "image", _vit_case("vit", "ViT", patch_size=4)),
    "simple_vit": ("vit-pytorch", "SimpleViT (2D sincos)", "image", _vit_case("simple_vit", "SimpleViT", patch_size=4)),
    "cait": ("vit-pytorch", "CaiT (class attention, layer scale)", "image",
             _vit_case("cait", "CaiT", patch_size=4, cls_depth=1)),
    "deepvit": ("vit-pytorch", "DeepViT (re-attention)", "image", _vit_case("deepvit", "DeepViT", patch_size=4)),
    "pit": ("vit-pytorch", "PiT (pooling stages)", "image", _vit_case("pit", "PiT", patch_size=4, depth=(1, 1))),
    "cross_vit": ("vit-pytorch", "CrossViT (two branches)", "image", _vit_case(
        "cross_vit", "CrossViT", dim=None, depth=1, heads=None, mlp_dim=None, dim_head=None, sm_dim=32, lg_dim=DIM,
        sm_patch_size=4, lg_patch_size=8, sm_enc_depth=1, sm_enc_heads=HEADS, sm_enc_mlp_dim=DIM, sm_enc_dim_head=8,
        lg_enc_depth=1, lg_enc_heads=HEADS, lg_enc_mlp_dim=DIM, lg_enc_dim_head=16, cross_attn_depth=1,
        cross_attn_heads=HEADS, cross_attn_dim_head=16, dropout=0.0, emb_dropout=0.0)),
    "t2t_vit": ("vit-pytorch", "T2T-ViT (unfold tokens)", "image", _vit_case(
        "t2t", "T2TViT", t2t_layers=((3, 2), (3, 2)))),
    "xcit": ("vit-pytorch", "XCiT (cross-covariance attention)", "image", _vit_case(
        "xcit", "XCiT", patch_size=4, cls_depth=1, mlp_dim=2 * DIM, local_patch_kernel_size=3, layer_dropout=0.0)),
    "tab_transformer": ("tab-transformer-pytorch", "TabTransformer", "tab", _tab("TabTransformer")),
    "ft_transformer": ("tab-transformer-pytorch", "FT-Transformer", "tab", _tab("FTTransformer")),
    "perceiver": ("perceiver-pytorch", "Perceiver (image, channels last)", "image_hwc", _perceiver),
    "perceiver_lm": ("perceiver-pytorch", "PerceiverIO LM", "lm", _perceiver_lm),
    "performer_lm": ("performer-pytorch", "Performer causal LM (FAVOR+)", "lm", _performer(True)),
    "performer_enc": ("performer-pytorch", "Performer encoder (FAVOR+)", "lm", _performer(False)),
    "xt_relpos": ("x-transformers", "decoder LM: T5 relative position bias", "lm", lambda: _xt(rel_pos_bias=True)),
    "xt_qknorm": ("x-transformers", "decoder LM: qk-norm attention", "lm", lambda: _xt(attn_qk_norm=True)),
    "vit_small": ("vit-pytorch", "ViT for small datasets (SPT, LSA)", "image", _vit_case(
        "vit_for_small_dataset", "ViT", patch_size=4)),
    "simple_vit_reg": ("vit-pytorch", "SimpleViT with register tokens", "image", _vit_case(
        "simple_vit_with_register_tokens", "SimpleViT", patch_size=4)),
    "local_transformer": ("local-attention", "LocalTransformer (windowed causal LM)", "lm", _local_transformer),
    "x_mlp": ("x-mlps-pytorch", "MLP over tokens", "cont", _x_mlp),
    "torch_encoder_lm": ("torch.nn", "TransformerEncoder causal LM (MultiheadAttention)", "lm", TorchEncoderLM),
    "torch_seq2seq": ("torch.nn", "nn.Transformer encoder-decoder", "seq2seq", TorchSeq2Seq),
    "torch_lstm": ("torch.nn", "LSTM LM (no block container)", "lm", LSTMLM),
    "nanogpt": (NANOGPT, "GPT: fused c_attn split by n_embd, tied head", "lm", _nanogpt),
    "litgpt_llama": (LITGPT, "llama layout, 0.5's qkv split by sizes, GQA", "lm", _litgpt("LitLlamaSplit")),
    "litgpt_llama_04": (LITGPT, "llama layout, 0.4's attn interleaved per group", "lm",
                        _litgpt("LitLlamaInterleaved")),
}
ROW_KEYS = ("library", "family")        # what catalogue()'s pair is, in a bench row
LIBRARIES = ("x-transformers", "vit-pytorch", "tab-transformer-pytorch", "perceiver-pytorch", "performer-pytorch",
             "local-attention", "x-mlps-pytorch", "torch.nn", NANOGPT, LITGPT)


def catalogue() -> dict:
    """{case: (library, family)} in registry order (bench/lib_catalogue.py's rows)."""
    return {k: v[:2] for k, v in CASES.items()}


def _name(kind: str) -> str:
    return kind[len("lib:"):] if kind.startswith("lib:") else kind


def build(kind: str, seed: int = 0, device="cpu"):
    """(model in train mode, loss_fn(out, target)) with weights from `seed`."""
    lib, _, inputs, make = CASES[_name(kind)]
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            m = make()
    except NotImplementedError:
        # an __init__ that reads a tensor's values (FT-Transformer's `arange(n).tolist()`, Performer's
        # QR-drawn projection) cannot run on meta: built on CPU (tiny), then moved
        torch.manual_seed(seed)
        m = make().to(device)
    return m.train(), (_mse if inputs in ("cont", "tab") else _ce)


def batch(kind: str, b: int, step: int):
    """(inputs tuple, targets) for step `step`: fresh seeded data each step."""
    inputs = CASES[_name(kind)][2]
    g = torch.Generator().manual_seed(2000 + step)
    if inputs == "image_hwc":                # Perceiver reads images as [b, h, w, c]
        return (torch.randn(b, IMAGE, IMAGE, 3, generator=g),), torch.randint(0, LABELS, (b,), generator=g)
    if inputs == "image":
        return (torch.randn(b, 3, IMAGE, IMAGE, generator=g),), torch.randint(0, LABELS, (b,), generator=g)
    if inputs == "cont":
        x = torch.randn(b, SEQ, FEATURES, generator=g)
        return (x,), torch.randn(b, SEQ, FEATURES, generator=g)
    if inputs == "tab":
        cat = torch.stack([torch.randint(0, n, (b,), generator=g) for n in CATEGORIES], dim=1)
        cont = torch.randn(b, CONTINUOUS, generator=g)
        return (cat, cont), torch.randn(b, 1, generator=g)
    ids = torch.randint(1, VOCAB, (b, SEQ + 1), generator=g)
    if inputs == "seq2seq":
        dec = torch.randint(1, VOCAB, (b, SEQ + 1), generator=g)
        return (ids[:, :-1], dec[:, :-1]), dec[:, 1:]
    return (ids[:, :-1],), ids[:, 1:]


def skip_reason(kind: str) -> str | None:
    """Why a case cannot be built here (None: it can): its library is not installed."""
    lib = CASES[_name(kind)][0]
    mod = {"x-transformers": "x_transformers", "vit-pytorch": "vit_pytorch", "tab-transformer-pytorch":
           "tab_transformer_pytorch", "perceiver-pytorch": "perceiver_pytorch",
           "performer-pytorch": "performer_pytorch", "local-attention": "local_attention",
           "x-mlps-pytorch": "x_mlps_pytorch"}.get(lib)          # torch.nn and the reproduced files: here
    if mod is not None and importlib.util.find_spec(mod) is None:
        return f"No module named {mod!r}: pip install -c constraints.txt '.[probe]'"
    return None
