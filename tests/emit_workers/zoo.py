"""Test models, data and the single-process reference run.  Uses the sapp model zoo when it is there
(gpt-tiny, mlp-tiny, wide-deep-tiny), else the zoo's classes at tiny sizes; GPT-2 comes from a
transformers config (no download)."""
from __future__ import annotations

import torch
from torch.nn import functional as F

SEQ, VOCAB = 16, 64


def _zoo():
    try:
        from sapp import models
        models.get  # noqa: B018
        return models
    except Exception:
        return None


def build(kind: str, seed: int = 0):
    """(model, loss_fn) built deterministically from `seed`; dropout 0 everywhere."""
    torch.manual_seed(seed)
    if kind == "gpt":
        from sapp.models.gpt import GPT
        m = GPT(l=4, h=32, a=4, V=VOCAB, s=SEQ, dropout=0.0)
        return m, lambda out, y: F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    if kind == "mlp":
        from sapp.models.mlp import MLP
        m = MLP(dims=(32, 64, 64, 32), classes=10)
        return m, F.cross_entropy
    if kind == "widedeep":
        from sapp.models.widedeep import WideDeep
        m = WideDeep(rows_per_field=50, dense=5, fields=4, dim=8, deep=(32, 16), sparse=False)
        return m, F.binary_cross_entropy_with_logits
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=32, use_cache=False,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        m = GPT2LMHeadModel(cfg)
        return m, lambda out, y: F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    raise ValueError(kind)


def batch(kind: str, b: int, step: int):
    """(inputs tuple, targets) for the global batch of `step`: fixed seed, independent of the model."""
    g = torch.Generator().manual_seed(1000 + step)
    if kind == "gpt":
        ids = torch.randint(0, VOCAB, (b, SEQ + 1), generator=g)
        return (ids[:, :-1],), ids[:, 1:]
    if kind == "gpt2":
        ids = torch.randint(0, 256, (b, SEQ + 1), generator=g)
        return (ids[:, :-1],), ids[:, 1:]
    if kind == "mlp":
        return (torch.randn(b, 32, generator=g),), torch.randint(0, 10, (b,), generator=g)
    if kind == "widedeep":
        return ((torch.randn(b, 5, generator=g), torch.randint(0, 50, (b, 4), generator=g)),
                torch.randint(0, 2, (b,), generator=g).float())
    raise ValueError(kind)


def param_count(kind: str) -> int:
    m, _ = build(kind)
    return sum(p.numel() for p in m.parameters())


def reference(kind: str, steps: int, b: int, lr: float = 1e-3) -> list:
    """Single-process training on the full batch: the losses every plan must reproduce."""
    m, loss_fn = build(kind)
    opt = torch.optim.Adam(m.parameters(), lr=lr)
    out = []
    for i in range(steps):
        x, y = batch(kind, b, i)
        o = m(*x)
        o = o.logits if hasattr(o, "logits") else o
        loss = loss_fn(o, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out
