"""Multi-head latent attention (MLA), as DeepSeek-V2/V3 define it (DeepSeek-V3 technical report, arXiv
2412.19437, section 2.1.1): queries and keys/values go through low-rank projections.

    c_q = RMSNorm(x W_dq)           [q_lora_rank]        q = c_q W_uq      a heads of (nope + rope)
    c_kv, k_rope = x W_dkv          [kv_lora_rank + rope] k_nope, v = RMSNorm(c_kv) W_ukv
    k = (k_nope, k_rope shared by every head), rotary embeddings on the rope parts of q and k
    o = softmax(q k^T / sqrt(nope + rope)) v W_o                           a heads of v_head_dim

DeepSeek-V3: 128 heads, q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128
(187M parameters a layer at hidden 7168).  The attention kernel runs keys of nope + rope = 192 and
values of 128 per head (F.scaled_dot_product_attention takes a value width of its own).  The
rotary tables use plain RoPE (the report's YaRN extension is a long-context phase, not pre-training)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .llama import rotary_tables, rotate


class RMSNorm(nn.Module):
    def __init__(self, h, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class MLA(nn.Module):
    def __init__(self, h, a, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, s, theta,
                 eps=1e-6):
        super().__init__()
        self.nope, self.rope, self.vd, self.kv_rank = qk_nope_head_dim, qk_rope_head_dim, v_head_dim, kv_lora_rank
        self.q_a = nn.Linear(h, q_lora_rank, bias=False)
        self.q_norm = RMSNorm(q_lora_rank, eps)
        self.q_b = nn.Linear(q_lora_rank, a * (qk_nope_head_dim + qk_rope_head_dim), bias=False)
        self.kv_a = nn.Linear(h, kv_lora_rank + qk_rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(kv_lora_rank, eps)
        self.kv_b = nn.Linear(kv_lora_rank, a * (qk_nope_head_dim + v_head_dim), bias=False)
        self.o = nn.Linear(a * v_head_dim, h, bias=False)
        cos, sin = rotary_tables(s, qk_rope_head_dim, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        # -1 heads: a tensor-parallel rank's column shard of q_b / kv_b holds whole heads
        q = self.q_b(self.q_norm(self.q_a(x))).view(b, t, -1, self.nope + self.rope).transpose(1, 2)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        c, k_pe = self.kv_a(x).split([self.kv_rank, self.rope], dim=-1)
        kv = self.kv_b(self.kv_norm(c)).view(b, t, -1, self.nope + self.vd).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.vd], dim=-1)
        cos, sin = self.cos[:t], self.sin[:t]
        q_pe = rotate(q_pe, cos, sin)
        k_pe = rotate(k_pe.view(b, t, 1, self.rope).transpose(1, 2), cos, sin)
        heads = q.shape[1]
        q = torch.cat((q_nope, q_pe), dim=-1)
        k = torch.cat((k_nope, k_pe.expand(b, heads, t, self.rope)), dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


def mla_params(h, a, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, **_) -> int:
    """Parameters of one MLA layer (its two RMSNorms included)."""
    return (h * q_lora_rank + q_lora_rank + q_lora_rank * a * (qk_nope_head_dim + qk_rope_head_dim)
            + h * (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank + kv_lora_rank * a * (qk_nope_head_dim + v_head_dim)
            + a * v_head_dim * h)
