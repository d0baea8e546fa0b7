"""BERT encoder (post-LN) with a masked-language-model head over the vocabulary.

Loss convention (see sapp.models.loss_fn): cross-entropy of the MLM logits [b, s, V] against a target
token at EVERY position (no 15% masking) - the compute and memory are those of MLM pre-training with
all positions scored, which is the upper bound the planner should budget for."""
import math

import torch
from torch import nn
from torch.nn import functional as F

from .gpt import init_weights


class Embed(nn.Module):
    def __init__(self, V, s, h, dropout):
        super().__init__()
        self.tok = nn.Embedding(V, h)
        self.pos = nn.Embedding(s, h)
        self.typ = nn.Embedding(2, h)
        self.ln = nn.LayerNorm(h, eps=1e-12)
        self.drop = nn.Dropout(dropout)

    def forward(self, ids):
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        typ = torch.zeros_like(ids)          # single-segment input
        return self.drop(self.ln(self.tok(ids) + self.pos(pos) + self.typ(typ)))


class Attention(nn.Module):
    def __init__(self, h, a, dropout):
        super().__init__()
        self.hd = h // a
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, _ = x.shape
        qkv = self.qkv(x).view(b, t, -1, 3 * self.hd).transpose(1, 2)
        q, k, v = qkv.split(self.hd, dim=-1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, -1)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, h, a, ffn, dropout):
        super().__init__()
        self.attn = Attention(h, a, dropout)
        self.ln1 = nn.LayerNorm(h, eps=1e-12)
        self.fc1 = nn.Linear(h, ffn)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(ffn, h)
        self.drop = nn.Dropout(dropout)
        self.ln2 = nn.LayerNorm(h, eps=1e-12)

    def forward(self, x):
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.drop(self.fc2(self.act(self.fc1(x)))))


class MLMHead(nn.Module):
    def __init__(self, h, V):
        super().__init__()
        self.dense = nn.Linear(h, h)
        self.act = nn.GELU()
        self.ln = nn.LayerNorm(h, eps=1e-12)
        self.decoder = nn.Linear(h, V)

    def forward(self, x):
        return self.decoder(self.ln(self.act(self.dense(x))))


class Bert(nn.Module):
    def __init__(self, l, h, a, V, s, ffn=None, dropout=0.1):
        super().__init__()
        ffn = ffn or 4 * h
        self.embed = Embed(V, s, h, dropout)
        self.layers = nn.ModuleList(Block(h, a, ffn, dropout) for _ in range(l))
        self.head = MLMHead(h, V)
        init_weights(self)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.layers:
            x = block(x)
        return self.head(x)


def param_count(l, h, a, V, s, ffn=None, **_):
    ffn = ffn or 4 * h
    per_layer = 4 * h * h + 4 * h + 2 * h * ffn + ffn + h + 4 * h
    embed = (V + s + 2) * h + 2 * h
    head = h * h + h + 2 * h + h * V + V
    return l * per_layer + embed + head
