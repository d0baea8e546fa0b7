"""Test models, data and the single-process reference run: the sapp zoo's gpt-tiny (eager and SDPA attention), llama-tiny, mlp-tiny and
wide-deep-tiny, and HF GPT-2 from a transformers config (no download)."""
from __future__ import annotations

import torch
from torch.nn import functional as F

TINY = {"gpt": ("gpt-tiny", {"dropout": 0.0}), "mlp": ("mlp-tiny", {}),
        "gpt-sdpa": ("gpt-tiny", {"dropout": 0.0, "attn": "sdpa"}), "llama": ("llama-tiny", {}),
        # dense tables: the reference's torch.optim.Adam takes no sparse gradients (host placement
        # with sparse tables is tested with H4's sapp/emit/host/host.py)
        "widedeep": ("wide-deep-tiny", {"sparse": False}),
        # sparse tables for host placement (trained by the placement's sparse optimizers)
        "widedeep-sparse": ("wide-deep-tiny", {"sparse": True}),
        # deeper gpt-tiny for interleaved pipelines (v = 3 chunks per stage, uneven stages)
        "gpt6": ("gpt-tiny", {"dropout": 0.0, "l": 6}), "gpt7": ("gpt-tiny", {"dropout": 0.0, "l": 7})}


def build(kind: str, seed: int = 0):
    """(model, loss_fn) built deterministically from `seed`; dropout 0 everywhere."""
    import sapp.models as models
    torch.manual_seed(seed)
    if kind in TINY:
        name, cfg = TINY[kind]
        m = models.get(name, device="cpu", **cfg)
        return m, models.loss_fn(m)
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=32, use_cache=False,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        m = GPT2LMHeadModel(cfg)
        return m, lambda out, y: F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    if kind == "stagey":        # blocks in nested lists, a parameter-less block, inputs read by every block
        from tests.emit_workers import pp_toys
        return pp_toys.build(seed)
    if kind == "stagey-direct":     # the same, each block called as `block.forward(...)` (SqueezeBERT)
        from tests.emit_workers import pp_toys
        return pp_toys.build(seed, direct=True)
    raise ValueError(kind)


def batch(kind: str, b: int, step: int):
    """(inputs tuple, targets) for the global batch of `step`: a fresh seeded batch every step."""
    g = torch.Generator().manual_seed(1000 + step)
    if kind in ("gpt", "gpt2", "gpt6", "gpt7", "gpt-sdpa", "llama"):
        ids = torch.randint(0, 256, (b, 17), generator=g)
        return (ids[:, :-1],), ids[:, 1:]
    if kind in ("stagey", "stagey-direct"):
        from tests.emit_workers import pp_toys
        return pp_toys.batch(b, step)
    if kind == "mlp":
        return (torch.randn(b, 32, generator=g),), torch.randint(0, 10, (b,), generator=g)
    if kind in ("widedeep", "widedeep-sparse"):
        return ((torch.randn(b, 13, generator=g), torch.randint(0, 100, (b, 26), generator=g)),
                torch.randint(0, 2, (b,), generator=g).float())
    raise ValueError(kind)


def param_count(kind: str) -> int:
    m, _ = build(kind)
    return sum(p.numel() for p in m.parameters())


def reference(kind: str, steps: int, b: int, lr: float = 1e-3, placement=None) -> list:
    """Single-process training on the full batch: the losses every plan must reproduce.  With a host
    placement the reference is the single-process emitted program with the same placement (its own
    equality to dense training is tested in tests/test_host_emit.py)."""
    if placement:
        from sapp.emit import emit
        from tests.emit_workers.plans import make_plan
        m, loss_fn = build(kind)
        plan = make_plan(params=sum(p.numel() for p in m.parameters()), global_batch=b, placement_groups=placement)
        prog = emit(m, plan, loss_fn=loss_fn, lr=lr, rank=0, world=1)
        return [prog.step(*batch(kind, b, i)) for i in range(steps)]
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
