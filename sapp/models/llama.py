"""Llama-style decoder (Llama 2/3 family): RMSNorm, rotary position embeddings, grouped-query attention
(`kv` key/value heads shared by `a / kv` query heads each; kv = 1 is multi-query), SwiGLU MLP, an untied
output head, and attention through `F.scaled_dot_product_attention(is_causal=True)` (flash attention on
GPUs: no s x s scores saved).

Module names follow the zoo GPT's contract (emit and pipeline split on `embed`, `layers.<i>`, `ln_f`,
`head`).  q, k and v are separate projections (`attn.wq`, `attn.wk`, `attn.wv`), each reshaped with
`view(b, t, -1, hd)`, so a column shard of wq holds whole query heads and a column shard of wk / wv whole
key/value heads: tensor parallelism of degree t needs t | kv, and query head i meets key/value head
i // (a/kv) on every shard because both are grouped contiguously.  The key/value heads are repeated to
the query heads with expand + reshape (what torch's `enable_gqa` does inside the kernel), the local
repeat count read off the local shapes."""
import torch
from torch import nn
from torch.nn import functional as F

from .gpt import init_weights


def rotary_tables(s, hd, theta):
    """cos, sin [s, hd] for the rotate-half form of rotary embeddings (each frequency used twice)."""
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(s, dtype=torch.float32), inv)
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos(), ang.sin()


def rotate(x, cos, sin):
    """x [b, heads, t, hd]: x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, h, a, kv, s, theta):
        super().__init__()
        self.hd = h // a
        self.wq = nn.Linear(h, a * self.hd, bias=False)
        self.wk = nn.Linear(h, kv * self.hd, bias=False)
        self.wv = nn.Linear(h, kv * self.hd, bias=False)
        self.wo = nn.Linear(a * self.hd, h, bias=False)
        cos, sin = rotary_tables(s, self.hd, theta)
        # Not persistent: derived from s and theta, not learned.
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, -1, self.hd).transpose(1, 2)
        k = self.wk(x).view(b, t, -1, self.hd).transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.hd).transpose(1, 2)
        cos, sin = self.cos[:t], self.sin[:t]
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        rep = q.shape[1] // k.shape[1]
        if rep > 1:
            kvh = k.shape[1]
            k = k[:, :, None].expand(b, kvh, rep, t, self.hd).reshape(b, kvh * rep, t, self.hd)
            v = v[:, :, None].expand(b, kvh, rep, t, self.hd).reshape(b, kvh * rep, t, self.hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, h, ffn):
        super().__init__()
        self.w1 = nn.Linear(h, ffn, bias=False)
        self.w3 = nn.Linear(h, ffn, bias=False)
        self.w2 = nn.Linear(ffn, h, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, h, a, kv, s, ffn, theta, eps):
        super().__init__()
        self.ln1 = nn.RMSNorm(h, eps=eps)
        self.attn = Attention(h, a, kv, s, theta)
        self.ln2 = nn.RMSNorm(h, eps=eps)
        self.mlp = MLP(h, ffn)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Llama(nn.Module):
    def __init__(self, l, h, a, kv, V, s, ffn, theta=500000.0, eps=1e-5):
        super().__init__()
        self.embed = nn.Embedding(V, h)
        self.layers = nn.ModuleList(Block(h, a, kv, s, ffn, theta, eps) for _ in range(l))
        self.ln_f = nn.RMSNorm(h, eps=eps)
        self.head = nn.Linear(h, V, bias=False)
        init_weights(self)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.layers:
            x = block(x)
        return self.head(self.ln_f(x))


def param_count(l, h, a, kv, V, s, ffn, **_):
    """Exact parameter count of Llama(...): per layer q and o (h x h each), k and v (h x kv·hd each),
    SwiGLU's three ffn x h matrices, two RMSNorm weights; an untied embedding and head, a final norm."""
    hd = h // a
    per_layer = 2 * h * a * hd + 2 * h * kv * hd + 3 * h * ffn + 2 * h
    return l * per_layer + 2 * V * h + h


def flops_per_token(l, h, a, kv, V, s, ffn, **_):
    """Forward model FLOPs per token (hand count): 2 per multiply-add of every weight matrix except the
    embedding lookup, plus attention's q·kᵀ and ·v over the whole sequence (4·s·h per layer, causal
    or not: as Megatron and the MFU convention count it).  Training = 3x this."""
    hd = h // a
    mats = l * (2 * h * a * hd + 2 * h * kv * hd + 3 * h * ffn) + V * h
    return 2.0 * mats + l * 4.0 * s * a * hd
