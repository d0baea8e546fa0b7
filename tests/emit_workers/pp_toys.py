"""A toy model cut into pipeline stages the way some Hugging Face architectures are built:

- its blocks sit in a ModuleList of ModuleLists (PoolFormer / PVT: `encoder.block.0.0`), so the
  called block is `groups.0.0`, never `groups.0`;
- a parameter-less ModuleList child builds position-only angles (from positions and a buffer), is
  called before the blocks but registered after them (GraniteMoeHybrid's `rotary_embs.0`), and every
  stage that reads its value computes its own copy (sapp/emit/pp/stage_local.py);
- every block reads the model input `ids` (DeepSeek-V4's hash-routed experts) and the embedding `e`
  made before the first block (a skip connection that carries a gradient): a stage past the first
  reads values made further back than the stage before it (sapp/emit/pp/stage_carry.py).

`build(direct=True)`: each block is a module whose forward only calls its parts and the encoder calls
it as `block.forward(...)` (SqueezeBERT's layers), which runs no module hook: the trace's module stack
names the block's submodules but not the block."""

from __future__ import annotations

import torch
from torch import nn

V, H, S = 64, 16, 8


class Angles(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("freq", torch.arange(1.0, H + 1) / H, persistent=False)

    def forward(self, n: int):
        return (torch.arange(n)[:, None].float() * self.freq).cos()         # (S, H), no data


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(H, H)
        self.route = nn.Embedding(V, H)          # picked by the token id, not by the hidden state

    def forward(self, h, ang, ids, e):
        return h + torch.tanh(self.lin(h) * ang) + self.route(ids) * e.sigmoid()


class Direct(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Block()

    def forward(self, h, ang, ids, e):
        return self.inner(h, ang, ids, e)


class Stagey(nn.Module):
    def __init__(self, n_blocks: int = 2, direct: bool = False):
        super().__init__()
        self.direct = direct
        self.emb = nn.Embedding(V, H)
        self.groups = nn.ModuleList(nn.ModuleList([Direct() if direct else Block()]) for _ in range(n_blocks))
        self.angles = nn.ModuleList([Angles()])
        self.head = nn.Linear(H, V)

    def forward(self, ids):
        e = self.emb(ids)
        ang = self.angles[0](ids.shape[1])
        h = e
        for group in self.groups:
            for block in group:
                h = block.forward(h, ang, ids, e) if self.direct else block(h, ang, ids, e)
        return self.head(h)


def build(seed: int = 0, n_blocks: int = 2, direct: bool = False):
    torch.manual_seed(seed)
    m = Stagey(n_blocks, direct)
    return m, lambda out, y: nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def batch(b: int, step: int):
    g = torch.Generator().manual_seed(2000 + step)
    ids = torch.randint(0, V, (b, S + 1), generator=g)
    return (ids[:, :-1],), ids[:, 1:]
