"""Attention with one fused q/k/v projection, written the way most LLM training libraries and ViTs write it:

- `decoder`: `qkv = Linear(d, 3d)`, `chunk(3)`, a head view by `-1` heads, causal attention, an output
  projection, a pre-norm MLP; a decoder stack with an output head;
- `vit`: a ViT-style encoder block (vit-pytorch's layout): `to_qkv` without bias, `chunk(3)`, a head
  reshape by the stored head count, non-causal attention, `to_out`;
- `gqa`: grouped-query attention fused as `(q + 2 kv)` heads, split by sizes computed from the stored
  head counts, k/v repeated to the query heads.

Each takes float inputs (batch, SEQ, DIM) and trains with a mean-squared loss against float targets."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

DIM, SEQ, HEADS, KV_HEADS, BATCH = 24, 6, 4, 2, 8


class Mlp(nn.Module):
    def __init__(self, d=DIM):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class FusedAttention(nn.Module):
    def __init__(self, d=DIM, heads=HEADS):
        super().__init__()
        self.hd = d // heads
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        qkv = self.qkv(self.norm(x))
        b, t, _ = qkv.shape             # read off the projection, as Megatron does (sequence parallel)
        q, k, v = qkv.chunk(3, dim=-1)
        q, k, v = (z.view(b, t, -1, self.hd).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(y.transpose(1, 2).reshape(b, t, -1))


class VitAttention(nn.Module):
    def __init__(self, d=DIM, heads=HEADS):
        super().__init__()
        self.heads, self.scale = heads, (d // heads) ** -0.5
        self.norm = nn.LayerNorm(d)
        self.to_qkv = nn.Linear(d, 3 * d, bias=False)
        self.to_out = nn.Linear(d, d)

    def forward(self, x):
        qkv = self.to_qkv(self.norm(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(*t.shape[:2], self.heads, -1).permute(0, 2, 1, 3) for t in qkv)
        attn = (q @ k.transpose(-1, -2) * self.scale).softmax(dim=-1)
        out = (attn @ v).permute(0, 2, 1, 3)
        out = out.reshape(*out.shape[:2], -1)
        return x + self.to_out(out)


class GqaAttention(nn.Module):
    def __init__(self, d=DIM, heads=HEADS, kv_heads=KV_HEADS):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.norm = nn.LayerNorm(d)
        self.wqkv = nn.Linear(d, (heads + 2 * kv_heads) * self.hd, bias=False)
        self.wo = nn.Linear(heads * self.hd, d, bias=False)

    def forward(self, x):
        qkv = self.wqkv(self.norm(x))
        b, t, _ = qkv.shape
        kv = self.kv_heads * self.hd
        q, k, v = qkv.split([self.heads * self.hd, kv, kv], dim=-1)
        q = q.view(b, t, self.heads, self.hd).transpose(1, 2)
        k, v = (z.view(b, t, self.kv_heads, self.hd).transpose(1, 2) for z in (k, v))
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.wo(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, attn):
        super().__init__()
        self.attn, self.mlp = attn, Mlp()

    def forward(self, x):
        return self.mlp(self.attn(x))


class Net(nn.Module):
    def __init__(self, attn_cls, depth=2):
        super().__init__()
        self.inp = nn.Linear(DIM, DIM)
        self.layers = nn.ModuleList([Block(attn_cls()) for _ in range(depth)])
        self.out_norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, DIM)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.out_norm(x))


MODELS = {"decoder": FusedAttention, "vit": VitAttention, "gqa": GqaAttention}
FUSED = {"decoder": "qkv", "vit": "to_qkv", "gqa": "wqkv"}          # the fused projection's name
OUT = {"decoder": "proj", "vit": "to_out", "gqa": "wo"}             # the output projection's name


def build(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    return Net(MODELS[kind])


def data(step: int, batch: int = BATCH):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(batch, SEQ, DIM, generator=g), torch.randn(batch, SEQ, DIM, generator=g)


def loss_fn(out, y):
    return F.mse_loss(out, y)


SIZES = {"decoder": [DIM] * 3, "vit": [DIM] * 3, "gqa": [DIM, DIM // 2, DIM // 2]}   # the pieces' widths
