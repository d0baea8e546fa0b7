"""Decoder-only GPT (pre-LN), written out op by op so capture sees every matmul, the softmax, the
masks and the dropouts (the activation formula 34sbh + 5as^2b is counted over exactly these ops).

Module names are part of the contract: emit and pipeline split on `embed`, `layers.<i>`, `ln_f`,
`head`; tensor parallelism shards `attn.qkv`/`mlp.fc1` column-wise and `attn.proj`/`mlp.fc2`
row-wise, which works because attention reshapes with `view(b, t, -1, hd)` (local head count).

`attn="eager"` (the default) writes attention out as q·kᵀ, causal mask, softmax, dropout, ·v: the s²
scores are saved tensors (the 5as²b term).  `attn="sdpa"` calls `F.scaled_dot_product_attention(
is_causal=True)`, one fused operator (flash attention on GPUs): nothing of size s² is saved and the
backward recomputes the scores (priced so by sapp.costmodel).  Both mask causally with the same
lower-triangular pattern, so the two train to the same numbers."""
import math

import torch
from torch import nn
from torch.nn import functional as F


class Embed(nn.Module):
    def __init__(self, V, s, h, dropout):
        super().__init__()
        self.tok = nn.Embedding(V, h)
        self.pos = nn.Embedding(s, h)
        self.drop = nn.Dropout(dropout)

    def forward(self, ids):
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        return self.drop(self.tok(ids) + self.pos(pos))


ATTN_KINDS = ("eager", "sdpa")


class Attention(nn.Module):
    def __init__(self, h, a, s, dropout, attn="eager"):
        super().__init__()
        self.hd = h // a
        self.kind = attn
        self.p = dropout
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        # Not persistent: it is derived from `s`, not learned, and must not appear in checkpoints.
        # SDPA masks inside the kernel (is_causal): no s x s buffer.
        if attn == "eager":
            self.register_buffer("mask", torch.tril(torch.ones(s, s, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        # Per-head [q|k|v] layout (Megatron's): a column-wise shard of `qkv` holds whole heads with
        # their q, k and v, so tensor parallelism needs no re-arrangement of the weight.
        qkv = self.qkv(x).view(b, t, -1, 3 * self.hd).transpose(1, 2)
        q, k, v = qkv.split(self.hd, dim=-1)
        if self.kind == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True)
            return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, -1)))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, -1)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, h, ffn, dropout):
        super().__init__()
        self.fc1 = nn.Linear(h, ffn)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(ffn, h)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.fc2(self.act(self.fc1(x))))


class Block(nn.Module):
    def __init__(self, h, a, s, ffn, dropout, attn="eager"):
        super().__init__()
        self.ln1 = nn.LayerNorm(h)
        self.attn = Attention(h, a, s, dropout, attn)
        self.ln2 = nn.LayerNorm(h)
        self.mlp = MLP(h, ffn, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, l, h, a, V, s, ffn=None, dropout=0.1, tie_embeddings=False, attn="eager"):
        super().__init__()
        if attn not in ATTN_KINDS:
            from ..errors import SappError
            raise SappError(f"attn={attn!r} is not an attention kind: use 'eager' or 'sdpa'")
        ffn = ffn or 4 * h
        self.embed = Embed(V, s, h, dropout)
        self.layers = nn.ModuleList(Block(h, a, s, ffn, dropout, attn) for _ in range(l))
        self.ln_f = nn.LayerNorm(h)
        self.head = nn.Linear(h, V, bias=False)
        if tie_embeddings:
            self.head.weight = self.embed.tok.weight
        self._init_weights()

    def _init_weights(self):
        init_weights(self)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.layers:
            x = block(x)
        return self.head(self.ln_f(x))


def init_weights(model):
    """GPT-2 style: N(0, 0.02) for matrices and embeddings, zero biases.  Deterministic under
    torch.manual_seed; a no-op cost on the meta device.  BERT uses the same."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


def param_count(l, h, a, V, s, ffn=None, tie_embeddings=False, **_):
    """Exact parameter count of GPT(...): REFERENCE Psi = 12lh^2 + 13lh + (V+s)h (ffn = 4h), plus the
    final LayerNorm (2h) and, when untied, the output head (Vh)."""
    ffn = ffn or 4 * h
    per_layer = 3 * h * h + 3 * h + h * h + h + 2 * h * ffn + ffn + h + 4 * h
    return l * per_layer + (V + s) * h + 2 * h + (0 if tie_embeddings else V * h)
