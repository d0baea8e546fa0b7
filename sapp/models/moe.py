"""Mixture-of-Experts decoder (Mixtral / DeepSeek-V3 style): pre-RMSNorm blocks, grouped-query
attention with rotary position embeddings through F.scaled_dot_product_attention (causal), and an MoE
feed-forward: a linear router,
softmax, top-k, the routed rows sorted by expert and run through two grouped expert GEMMs
(`sapp::grouped_mm`, SwiGLU), optional shared experts run on every token, optional dense blocks first.

Module names are part of the contract with sapp/emit/ep/experts.py: a block's MoE layer is `layers.<i>.moe`
with `router` (Linear h -> E), `w_in` [E, h, 2f] (gate | up), `w_out` [E, f, h] and `shared`
(a dense SwiGLU of width shared·f, or absent).  Expert parallelism replaces `MoE.experts_fn` (the
function that runs the sorted rows through the experts) with one that dispatches rows by all-to-all.

Capacity factor: 0 means dropless (every routed row is computed: Megatron-Core's default).  c > 0
keeps at most ceil(c · rows / E) rows per expert *of the tokens this call sees* (GShard's per-group
capacity; the rest contribute nothing), so a data-parallel run drops per replica, not per global
batch; the cost model prices c as padding every expert to its capacity."""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .gpt import init_weights
from .llama import rotary_tables, rotate
from .mla import MLA, RMSNorm, mla_params      # noqa: F401  (RMSNorm: this module's blocks and callers)


def _gmm(x, w, offs):
    """x[R, k] (rows sorted by expert) · w[E, k, n] with group ends offs[E] -> [R, n]."""
    out = x.new_zeros(x.shape[0], w.shape[2])
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = x[start:end] @ w[e]
        start = end
    return out


def _gmm_bwd(x, w, offs, gy):
    gx, gw = torch.zeros_like(x), torch.zeros_like(w)
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            gx[start:end] = gy[start:end] @ w[e].T
            gw[e] = x[start:end].T @ gy[start:end]
        start = end
    return gx, gw


# One opaque operator so capture sees one grouped GEMM (the `grouped_mm` rule: FLOPs 2·R·k·n), not a
# data-dependent Python loop; torch's own grouped_mm needs 16-byte-aligned strides on CPU.
torch.library.custom_op("sapp::grouped_mm", _gmm, mutates_args=(),
                        schema="(Tensor x, Tensor w, Tensor offs) -> Tensor")
torch.library.register_fake("sapp::grouped_mm", lambda x, w, offs: x.new_empty(x.shape[0], w.shape[2]))
torch.library.custom_op("sapp::grouped_mm_backward", _gmm_bwd, mutates_args=(),
                        schema="(Tensor x, Tensor w, Tensor offs, Tensor gy) -> (Tensor, Tensor)")
torch.library.register_fake("sapp::grouped_mm_backward",
                            lambda x, w, offs, gy: (torch.empty_like(x), torch.empty_like(w)))


def _gmm_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.offs = inputs[2]


def _gmm_autograd(ctx, gy):
    x, w = ctx.saved_tensors
    gx, gw = torch.ops.sapp.grouped_mm_backward(x, w, ctx.offs, gy)
    return gx, gw, None


torch.library.register_autograd("sapp::grouped_mm", _gmm_autograd, setup_context=_gmm_setup)


def grouped_mm(x, w, offs):
    return torch.ops.sapp.grouped_mm(x, w, offs)


def swiglu_experts(x, w_in, w_out, offs):
    """Rows sorted by expert through every expert's SwiGLU: [R, h] -> [R, h]."""
    gate, up = grouped_mm(x, w_in, offs).chunk(2, dim=-1)
    return grouped_mm(F.silu(gate) * up, w_out, offs)


class Attention(nn.Module):
    """GQA: a query heads of width hd, kv key/value heads (kv divides a); q, k, v, o without bias;
    rotary embeddings of base `theta` on q and k (sapp.models.llama's rotate-half form)."""

    def __init__(self, h, a, kv, hd, s, theta):
        super().__init__()
        self.a, self.kv, self.hd = a, kv, hd
        self.q = nn.Linear(h, a * hd, bias=False)
        self.k = nn.Linear(h, kv * hd, bias=False)
        self.v = nn.Linear(h, kv * hd, bias=False)
        self.o = nn.Linear(a * hd, h, bias=False)
        cos, sin = rotary_tables(s, hd, theta)
        # Not persistent: derived from s and theta, not learned.
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        # -1 heads: a tensor-parallel rank's column shard holds a / tp whole heads
        q = self.q(x).view(b, t, -1, self.hd).transpose(1, 2)
        k = self.k(x).view(b, t, -1, self.hd).transpose(1, 2)
        v = self.v(x).view(b, t, -1, self.hd).transpose(1, 2)
        cos, sin = self.cos[:t], self.sin[:t]
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if k.shape[1] != q.shape[1]:
            # each kv head serves a / kv consecutive query heads (expand + reshape: views and one copy)
            hk, rep = k.shape[1], q.shape[1] // k.shape[1]
            k = k[:, :, None].expand(b, hk, rep, t, self.hd).reshape(b, hk * rep, t, self.hd)
            v = v[:, :, None].expand(b, hk, rep, t, self.hd).reshape(b, hk * rep, t, self.hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, h, f):
        super().__init__()
        self.gate = nn.Linear(h, f, bias=False)
        self.up = nn.Linear(h, f, bias=False)
        self.down = nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def ep_capable(m) -> bool:
    """Whether expert parallelism can run module `m` (sapp/emit/ep/experts.py swaps its `experts_fn` for the
    all-to-all version): this module's contract, not any grouped-expert layer (an HF MoE's experts are
    priced and run whole on each rank)."""
    return hasattr(m, "experts_fn") and hasattr(m, "w_in") and hasattr(m, "w_out")


class MoE(nn.Module):
    """`n_group`, `topk_group`: group-limited routing (DeepSeek-V3 section 2.1.2, its config's names): the
    experts form n_group consecutive groups, a token keeps the topk_group groups of highest score (the
    sum of a group's two best affinities) and picks its top-k among their experts (0: no limit).  Laid
    out over nodes, that bounds the nodes a token's rows reach (costmodel/moe.py prices it)."""

    def __init__(self, h, experts, top_k, expert_ffn, shared=0, capacity_factor=0.0, n_group=0, topk_group=0):
        super().__init__()
        self.E, self.k, self.f, self.cf = experts, top_k, expert_ffn, capacity_factor
        self.groups = (n_group, topk_group) if n_group and topk_group and topk_group < n_group else None
        self.router = nn.Linear(h, experts, bias=False)
        self.w_in = nn.Parameter(torch.empty(experts, h, 2 * expert_ffn))
        self.w_out = nn.Parameter(torch.empty(experts, expert_ffn, h))
        self.shared = SwiGLU(h, shared * expert_ffn) if shared else None
        self.experts_fn = swiglu_experts      # emit/ep.py swaps in the all-to-all version

    def forward(self, x):
        b, t, h = x.shape
        flat = x.reshape(b * t, h)
        probs = F.softmax(self.router(flat), dim=-1, dtype=torch.float32)
        if self.groups is not None:
            probs = self._group_limited(probs)
        weight, expert = torch.topk(probs, self.k, dim=-1)
        weight = (weight / weight.sum(dim=-1, keepdim=True)).to(x.dtype)     # Mixtral: renormalised top-k
        ids = expert.reshape(-1)                                              # [T·k] routed rows
        order = torch.argsort(ids, stable=True)
        counts = torch.histc(ids.float(), bins=self.E, min=0, max=self.E - 1).long()
        offs = torch.cumsum(counts, 0)
        rows = flat[order // self.k]                                          # token of each sorted row
        w = weight.reshape(-1)
        if self.cf > 0:
            # position of each sorted row inside its expert's group; rows past capacity are dropped
            cap = math.ceil(self.cf * ids.numel() / self.E)
            pos = torch.arange(ids.numel(), device=x.device) - (offs - counts)[ids[order]]
            w = w.index_put((order,), w[order] * (pos < cap).to(w.dtype))
        y = self.experts_fn(rows, self.w_in, self.w_out, offs)
        # back to token-major order by the inverse permutation: a gather of each shard's own rows
        # (a scatter into a fresh buffer would be priced as resharding the whole buffer)
        out = y[torch.argsort(order)]
        out = (out.view(b * t, self.k, h) * w.view(b * t, self.k, 1)).sum(dim=1)
        if self.shared is not None:
            out = out + self.shared(flat)
        return out.view(b, t, h)


    def _group_limited(self, probs):
        """probs with the experts outside a token's topk_group best groups set to zero."""
        n, keep = self.groups
        per = probs.view(probs.shape[0], n, self.E // n)
        score = per.topk(min(2, self.E // n), dim=-1).values.sum(dim=-1)           # [T, n]
        cut = score.topk(keep, dim=-1).values[:, -1:]
        mask = (score >= cut).unsqueeze(-1).expand_as(per).reshape(probs.shape)
        return probs * mask.to(probs.dtype)


class Block(nn.Module):
    def __init__(self, h, a, kv, hd, ffn, moe_args, eps=1e-6, s=2048, theta=10000.0, mla=None):
        super().__init__()
        self.ln1 = RMSNorm(h, eps)
        if mla:
            self.attn = MLA(h, a, **mla, s=s, theta=theta, eps=eps)
        else:
            self.attn = Attention(h, a, kv, hd, s, theta)
        self.ln2 = RMSNorm(h, eps)
        if moe_args is None:
            self.mlp = SwiGLU(h, ffn)
        else:
            self.moe = MoE(h, **moe_args)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        ff = self.moe if hasattr(self, "moe") else self.mlp
        return x + ff(self.ln2(x))


class MoEModel(nn.Module):
    """l blocks (the first `dense` with a dense SwiGLU of width ffn, the rest MoE), token embedding
    (positions are rotary: no table), final RMSNorm, untied head.  `eps`: the RMSNorms' epsilon;
    `theta`: the rotary base (None: 10000, and an engine export states none)."""

    def __init__(self, l, h, a, kv, V, s, ffn, experts, top_k, expert_ffn, shared=0, dense=0,
                 capacity_factor=0.0, hd=None, eps=1e-6, theta=None, mla=None, n_group=0, topk_group=0,
                 dispatch_fp8=False):
        super().__init__()
        hd = hd or h // a
        # dispatch_fp8: the run sends its dispatch in FP8 (DeepSeek-V3's kernels): read by the cost model
        # only (costmodel/moe.py); the emitted all-to-all sends the rows as they are
        moe_args = dict(experts=experts, top_k=top_k, expert_ffn=expert_ffn, shared=shared,
                        capacity_factor=capacity_factor, n_group=n_group, topk_group=topk_group)
        self.embed = nn.Embedding(V, h)
        self.layers = nn.ModuleList(Block(h, a, kv, hd, ffn, None if i < dense else moe_args, eps, s,
                                          10000.0 if theta is None else theta, mla=mla) for i in range(l))
        self.ln_f = RMSNorm(h, eps)
        self.head = nn.Linear(h, V, bias=False)
        init_weights(self)
        for m in self.modules():
            if isinstance(m, MoE):
                nn.init.normal_(m.w_in, 0.0, 0.02)
                nn.init.normal_(m.w_out, 0.0, 0.02)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.layers:
            x = block(x)
        return self.head(self.ln_f(x))


def param_count(l, h, a, kv, V, s, ffn, experts, top_k, expert_ffn, shared=0, dense=0, hd=None, active=False,
                mla=None, **_):
    """Exact parameter count of MoEModel(...); active=True counts top_k routed experts per MoE block
    (what one token meets), DeepSeek's and Mixtral's "active parameters"."""
    hd = hd or h // a
    if mla:
        attn = mla_params(h, a, **mla) + 2 * h                   # MLA; two RMSNorms
    else:
        attn = h * a * hd * 2 + h * kv * hd * 2 + 2 * h            # q, o, k, v; two RMSNorms
    routed = (top_k if active else experts) * 3 * h * expert_ffn
    moe = h * experts + routed + shared * 3 * h * expert_ffn
    return l * attn + dense * 3 * h * ffn + (l - dense) * moe + 2 * V * h + h
