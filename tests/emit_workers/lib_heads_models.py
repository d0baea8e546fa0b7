"""Decoders of the probe set's libraries (x-transformers, performer-pytorch) whose attention tensor
parallelism splits by heads, at toy sizes in float64, for tests/test_tp_lib_heads.py: a per-head bias
made outside the split block (ALiBi, T5-style relative positions), an l2 qk-norm over the head dim,
grouped-query attention whose key heads are repeated as `(r kvh)`, and Performer's FAVOR+ (a random
projection repeated over the heads).  Each class builds the library's model as its README shows and
returns the logits; the file loads on its own (tests/emit_workers/custom_sp_run.py loads it by path)."""
import torch
from torch import nn

SEQ, VOCAB, DIM = 8, 64, 32


def _xt(**attn):
    from x_transformers import Decoder, TransformerWrapper
    return TransformerWrapper(num_tokens=VOCAB, max_seq_len=SEQ,
                              attn_layers=Decoder(dim=DIM, depth=2, **dict({"heads": 4, "attn_dim_head": 8}, **attn)))


class _Lib(nn.Module):
    """The library's model in float64 on the device in use (meta for the search): Performer draws
    its projection with a QR at build, which meta cannot run, so every model is built on the CPU."""

    def __init__(self):
        super().__init__()
        dev = torch.empty(0).device
        with torch.device("cpu"):
            net = self.make()
        self.net = net.to(device=dev, dtype=torch.float64)

    def forward(self, ids):
        return self.net(ids)


class XtAlibi(_Lib):
    def make(self):
        return _xt(alibi_pos_bias=True, alibi_num_heads=2)


class XtRelPos(_Lib):
    def make(self):
        return _xt(rel_pos_bias=True)


class XtQKNorm(_Lib):
    def make(self):
        return _xt(attn_qk_norm=True)


class XtGQA(_Lib):
    """Rotary, RMSNorm, GLU and 8 query heads over 4 key heads (a rank holds 2: x-transformers runs
    its grouped branch, not the one-key-head branch it takes at 1); a head width that is no head count
    (16), so the shape audit's stored sizes are told apart."""

    def make(self):
        return _xt(heads=8, attn_kv_heads=4, attn_dim_head=16, rotary_pos_emb=True, use_rmsnorm=True, ff_glu=True, ff_no_bias=True)


class PerformerCausal(_Lib):
    def make(self):
        from performer_pytorch import PerformerLM
        return PerformerLM(num_tokens=VOCAB, max_seq_len=SEQ, dim=DIM, depth=2, heads=4, dim_head=8, causal=True,
                           nb_features=16, feature_redraw_interval=None)


class TorchEncoder(nn.Module):
    """torch.nn's TransformerEncoder as a causal LM, pre-norm, batch-first: nn.MultiheadAttention applies
    its packed in_proj_weight itself (split by heads: sapp/emit/tp/mha.py)."""

    def __init__(self, batch_first=True):
        super().__init__()
        self.emb, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        layer = nn.TransformerEncoderLayer(DIM, 4, 2 * DIM, dropout=0.0, batch_first=batch_first, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head, self.batch_first = nn.Linear(DIM, VOCAB), batch_first
        self.to(torch.float64)

    def forward(self, ids):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device, dtype=torch.float64)
        x = self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        x = x if self.batch_first else x.transpose(0, 1)
        x = self.encoder(x, mask=mask, is_causal=True)
        return self.head(x if self.batch_first else x.transpose(0, 1))


class TorchEncoderSeqFirst(TorchEncoder):
    """The same with batch_first=False ([seq, batch, dim] inside, torch's default)."""

    def __init__(self):
        super().__init__(batch_first=False)


class XtLlama(_Lib):
    """The probe set's xt_llama at these sizes: rotary, RMSNorm, GLU and 4 query heads over 2 key heads,
    so a tp=2 rank holds one key head and x-transformers takes its one-key-head branch (k, v flattened
    to 'b n d'), other ops than the capture's repeat."""

    def make(self):
        return _xt(attn_kv_heads=2, rotary_pos_emb=True, use_rmsnorm=True, ff_glu=True, ff_no_bias=True)


class LocalWindows(_Lib):
    """local-attention's LocalTransformer (windowed causal attention, hyper-connections): q, k, v packed
    as `(b h) n d` for the windows, so a rank's heads ride the data batch from the pack to the unpack."""
    extra = {}

    def make(self):
        import random
        from local_attention import LocalTransformer
        random.seed(0)      # hyper-connections picks each layer's residual stream with Python's random
        return LocalTransformer(num_tokens=VOCAB, max_seq_len=SEQ, dim=DIM, depth=2, heads=4, dim_head=8,
                                causal=True, **dict({"local_attn_window_size": SEQ // 2}, **self.extra))


class LocalWindowsHeadBias(LocalWindows):
    """The same with its dynamic position bias: a per-head bias made outside the attention, repeated
    `h i j -> (b h) 1 i j` by its own head count (a rank's: the bias MLP's last layer split by heads);
    windows of 2, so no stored size but the head count equals one the region splits."""
    extra = {"use_dynamic_pos_bias": True, "local_attn_window_size": SEQ // 4}

    def __init__(self):
        super().__init__()
        # the bias MLP reads `arange(dtype=torch.float)`: cast to the model's float64
        self.net.dynamic_pos_bias.mlp.register_forward_pre_hook(lambda m, args: (args[0].to(torch.float64),))


class LocalWindowsMasked(LocalWindows):
    """The same called with a key-padding mask, which local-attention repeats `b ... -> (b h) ...` over
    the batch its heads are folded into: a tensor made outside the attention over that batch."""

    def forward(self, ids):
        return self.net(ids, mask=ids >= 0)
