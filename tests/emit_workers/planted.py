"""Small models written the way third-party model code often is, for capture, search and emit tests:

- `NoneListNet`: a ModuleList holding None between its blocks (a layer switched off by config), the
  forward skipping it;
- `AutocastNet`: attention whose rotary embedding runs under `torch.autocast(x.device.type,
  enabled=False)` (capture on meta sees the device type 'meta', which autocast refuses);
- `FixedHeadsNet`: attention that reshapes by a head count fixed at import (a module constant): at
  one tensor-parallel rank's shapes the `-1` of its reshape absorbs half the head dim, so tp=2 cannot run;
- `ValueBranchNet`: blocks with a Python branch on a tensor's value, which capture follows as the
  example takes it but a traced pipeline stage would fix: pp=2 cannot run.

Each takes float inputs (batch, SEQ, DIM) and trains with a mean-squared loss against float targets."""
from __future__ import annotations

import torch
from torch import nn

DIM, SEQ, HEADS, BATCH = 16, 6, 4, 8
FIXED_HEADS = 4                 # FixedHeadsNet's head count, not stored on any module


class MLPBlock(nn.Module):
    def __init__(self, d=DIM):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


def _rotate(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class RotaryAttention(nn.Module):
    """q/k/v projections, rotary positions computed in float32 with autocast off (the idiom of many
    decoder implementations), causal attention, an output projection."""

    def __init__(self, d=DIM, heads=HEADS):
        super().__init__()
        self.hd = d // heads
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.o = nn.Linear(d, d)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd)),
                             persistent=False)

    def rotary(self, x, t):
        with torch.autocast(x.device.type, enabled=False):
            pos = torch.arange(t, device=x.device, dtype=torch.float32)
            ang = torch.outer(pos, self.inv_freq.float())
            emb = torch.cat((ang, ang), dim=-1)
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, -1, self.hd).transpose(1, 2)
        k = self.k(x).view(b, t, -1, self.hd).transpose(1, 2)
        v = self.v(x).view(b, t, -1, self.hd).transpose(1, 2)
        cos, sin = self.rotary(x, t)
        q, k = q * cos + _rotate(q) * sin, k * cos + _rotate(k) * sin
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class AttnBlock(nn.Module):
    def __init__(self, d=DIM):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.attn = RotaryAttention(d)
        self.mlp = MLPBlock(d)

    def forward(self, x):
        return self.mlp(x + self.attn(self.norm(x)))


class NoneListNet(nn.Module):
    def __init__(self, d=DIM):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.layers = nn.ModuleList([MLPBlock(d), None, MLPBlock(d)])
        self.head = nn.Linear(d, d)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            if layer is not None:
                x = layer(x)
        return self.head(x)


class AutocastNet(nn.Module):
    def __init__(self, d=DIM, depth=2):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.layers = nn.ModuleList([AttnBlock(d) for _ in range(depth)])
        self.head = nn.Linear(d, d)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class FixedHeadsAttention(nn.Module):
    def __init__(self, d=DIM):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.o = nn.Linear(d, d)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (y.reshape(b, t, FIXED_HEADS, -1).transpose(1, 2) for y in (self.q(x), self.k(x), self.v(x)))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class FixedHeadsBlock(nn.Module):
    def __init__(self, d=DIM):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.attn = FixedHeadsAttention(d)
        self.mlp = MLPBlock(d)

    def forward(self, x):
        return self.mlp(x + self.attn(self.norm(x)))


class FixedHeadsNet(nn.Module):
    def __init__(self, d=DIM, depth=2):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.layers = nn.ModuleList([FixedHeadsBlock(d) for _ in range(depth)])
        self.head = nn.Linear(d, d)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class ValueBranchBlock(MLPBlock):
    def forward(self, x):
        y = super().forward(x)
        if y.abs().mean() > 100:        # never taken by these inputs, but a branch on a value
            y = y * 0.5
        return y


class ValueBranchNet(nn.Module):
    def __init__(self, d=DIM):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.layers = nn.ModuleList([ValueBranchBlock(d), ValueBranchBlock(d)])
        self.head = nn.Linear(d, d)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


MODELS = {"none-list": NoneListNet, "autocast": AutocastNet, "fixed-heads": FixedHeadsNet,
          "value-branch": ValueBranchNet}


def build(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    return MODELS[kind]()


def data(step: int, batch: int = BATCH):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(batch, SEQ, DIM, generator=g), torch.randn(batch, SEQ, DIM, generator=g)


def loss_fn(out, y):
    return nn.functional.mse_loss(out, y)


def reference(kind: str, steps: int, lr: float = 1e-3) -> list:
    """One process's losses over `steps` Adam steps."""
    m = build(kind)
    opt = torch.optim.Adam(m.parameters(), lr=lr)
    out = []
    for i in range(steps):
        x, y = data(i)
        loss = loss_fn(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out
