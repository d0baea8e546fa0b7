"""Tensor parallelism for attention that reshapes by sizes nothing gives a rank's value of (issue 51,
finding 5): nanoGPT's CausalSelfAttention with its head size left to `-1` after a head count fixed for
the whole model (`k.view(B, T, H, -1)`, H a module constant).  At one rank's layer shapes the view
holds as written and gives other heads, so neither the stored sizes nor the reshapes run at a rank's
share (sapp/emit/tp/local_shapes.py, which rewrites only a call that cannot hold) fix it.  The
runnable check (sapp/emit/runnable.py) used to drop the whole tp degree (a pinned tp=2 refused); now
that block is gathered (kept replicated on every tp rank) and tp keeps sharding the MLPs and the
vocabulary.  2 gloo processes, float64, against one process trained the same way.  (nanoGPT's own
attention, `C // self.n_head` with C off the input, runs split by heads: tests/test_tp_heads.py.)"""
import os

import torch
from torch import nn
from torch.nn import functional as F

D, H, SEQ, VOCAB, BATCH, LAYERS = 32, 4, 8, 64, 4, 2


class CausalSelfAttention(nn.Module):
    """nanoGPT's (flash path), its views by a module-level head count with the head size left to -1."""

    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(D, 3 * D)
        self.c_proj = nn.Linear(D, D)
        self.n_head, self.n_embd = H, D

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, H, -1).transpose(1, 2)
        q = q.view(B, T, H, -1).transpose(1, 2)
        v = v.view(B, T, H, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc, self.gelu, self.c_proj = nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(D), CausalSelfAttention(), nn.LayerNorm(D), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """nanoGPT's GPT at toy sizes: learned positions, tied wte / lm_head; float64 throughout."""

    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, D), wpe=nn.Embedding(SEQ, D),
            h=nn.ModuleList([Block() for _ in range(LAYERS)]), ln_f=nn.LayerNorm(D)))
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.double()

    def forward(self, idx):
        _, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def _plan(tmp_path, sp: bool):
    from sapp.api import search
    from sapp.emit.runtime.program import default_loss
    from tests.emit_workers import custom_sp_run
    x, y = custom_sp_run._data(NanoGPT, 0)
    torch.manual_seed(0)
    plan = search(NanoGPT(), custom_sp_run.TP_CLUSTER, global_batch=BATCH, example_inputs=(x,),
                  loss_fn=default_loss, targets=y, constraints={"dp": 1, "tp": 2, "pp": 1, "zero": 0, "sp": sp})
    path = os.path.join(tmp_path, "plan.json")
    plan.save(path)
    return plan, path


def _run(tmp_path, path) -> list:
    from tests.emit_workers.custom_sp_run import launch
    ranks = launch(f"{os.path.abspath(__file__)}:NanoGPT", path, tmp_path, timeout=150)
    return [r["losses"] for _, r in sorted(ranks.items())]


def test_nanogpt_attention_gathered_mlp_keeps_tp(tmp_path):
    """A pinned tp=2 is kept (before: refused, "the model cannot run at one rank's shapes"); the MLPs
    are split, the attention is not, a note says why; 3 Adam steps equal one process to 1e-10."""
    from tests.emit_workers import custom_sp_run
    plan, path = _plan(tmp_path, sp=False)
    styles = plan._d["tp_modules"]
    assert plan.parallel["tp"] == 2
    for i in range(LAYERS):
        assert styles.get(f"transformer.h.{i}.mlp.c_fc") == "colwise", styles
        assert styles.get(f"transformer.h.{i}.mlp.c_proj") == "rowwise", styles
        assert not any(n.startswith(f"transformer.h.{i}.attn") for n in styles), styles
    assert any("gathered transformer.h.*.attn.c_attn" in n for n in plan._d["notes"]), plan._d["notes"]
    ref = custom_sp_run.single(NanoGPT)
    for losses in _run(tmp_path, path):
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
        assert len(losses) == 3 and diff <= 1e-10, (diff, losses, ref)


def test_gathered_patterns_match_every_block():
    from sapp.search.tp_layout import gather_pattern, gathered
    pats = {gather_pattern("transformer.h.0.attn.c_attn")}
    assert pats == {"transformer.h.*.attn.c_attn"}
    assert gathered("transformer.h.7.attn.c_attn", pats)
    assert not gathered("transformer.h.7.mlp.c_fc", pats) and not gathered("", pats)
