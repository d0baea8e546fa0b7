"""Context parallelism emitted (plan `parallel.cp` > 1), as sapp/costmodel/context.py prices it.

    cp ranks share every sample: each holds 2 of the sequence's 2·cp chunks (rank r: chunks r and
    2cp-1-r, so causal work is even), runs the whole layer on its tokens, and all-gathers the keys
    and values of the whole sequence before attention (`GatherSeq`: all-gather forward, the
    gradients' reduce-scatter backward).  Queries stay local; the causal mask compares global
    positions, so it is the single-device mask restricted to this rank's rows.  Position ids are the
    tokens' global positions.  Parameters are replicated over cp, and the gradients are averaged over
    dp x cp: the emitter's data-parallel group is dp·cp ranks (mesh order pp, dp, cp, tp), and each
    rank's loss is the mean over its tokens, so the average of the dp·cp means is the global mean.

What it covers: the zoo GPT's attention (`sapp.models.gpt.Attention`, eager, causal) and learned
positions (`Embed`), with pp = 1, tp = 1 and ZeRO 0/1.  Anything else is refused before training
(`check_plan`, `apply`) with a PlanError saying what to change.  On gloo (no reduce-scatter) the
backward is an all-reduce keeping this rank's chunk: the same numbers, more bytes than priced."""
from __future__ import annotations

import math
import types

import torch
import torch.distributed as dist
from torch.nn import functional as F

from ..costmodel.context import check_sequence, chunk_positions
from ..errors import PlanError
from .program import Program


# ---- plan checks ---------------------------------------------------------------------------------
def check_plan(plan) -> int:
    """The plan's cp degree, refusing combinations this emitter does not run."""
    par = plan.parallel
    cp = par.get("cp", 1)
    if cp <= 1:
        return 1
    if par["pp"] > 1 or par["tp"] > 1:
        raise PlanError(f"cp={cp} is emitted with pp=1 and tp=1 only (plan has pp={par['pp']}, tp={par['tp']}); "
                        f"pin pp=1 tp=1 with cp, or drop cp")
    if plan.zero >= 2:
        raise PlanError(f"cp={cp} is emitted with ZeRO 0 or 1 only (plan has zero={plan.zero}); pin zero to 0 or 1")
    if (plan.placement or {}).get("groups"):
        raise PlanError(f"cp={cp} is not emitted with host placement; pin placement to the device")
    return cp


# ---- sequence layout -----------------------------------------------------------------------------
def positions(seq: int, cp: int, rank: int, device=None) -> torch.Tensor:
    """Global positions of the tokens cp rank `rank` holds (load-balanced: chunks r and 2cp-1-r)."""
    if not check_sequence(seq, cp):
        raise PlanError(f"sequence length {seq} does not split into 2*cp = {2 * cp} equal chunks; use a "
                        f"sequence length divisible by {2 * cp}")
    return torch.tensor(chunk_positions(seq, cp, rank), dtype=torch.long, device=device)


def gathered_positions(seq: int, cp: int, device=None) -> torch.Tensor:
    """Global positions along an all-gathered sequence (rank 0's tokens, then rank 1's, ...)."""
    return torch.cat([positions(seq, cp, r, device) for r in range(cp)])


def shard_sequence(t: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This cp rank's tokens of a [batch, seq, ...] tensor (inputs, labels)."""
    return t.index_select(dim, positions(t.shape[dim], cp, rank, t.device))


# ---- the K/V exchange ------------------------------------------------------------------------------
class GatherSeq(torch.autograd.Function):
    """All-gather along `dim` over the cp group; backward: the gradient of this rank's part summed
    over the group (a reduce-scatter)."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        ctx.n, ctx.r = dist.get_world_size(group), dist.get_rank(group)
        parts = [torch.empty_like(x) for _ in range(ctx.n)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        if dist.get_backend(ctx.group) == "nccl":
            chunks = [c.contiguous() for c in g.chunk(ctx.n, dim=ctx.dim)]
            out = torch.empty_like(chunks[0])
            dist.reduce_scatter(out, chunks, group=ctx.group)
        else:                       # gloo has no reduce-scatter: all-reduce, keep this rank's chunk
            dist.all_reduce(g, group=ctx.group)
            out = g.chunk(ctx.n, dim=ctx.dim)[ctx.r].contiguous()
        return out, None, None


# ---- module rewrites ---------------------------------------------------------------------------------
def _embed_forward(self, ids):
    cp, r = self._sapp_cp
    pos = positions(ids.shape[1] * cp, cp, r, ids.device)
    return self.drop(self.tok(ids) + self.pos(pos))


def _attention_forward(self, x):
    b, t, _ = x.shape
    group, cp, r = self._sapp_cp
    qkv = self.qkv(x).view(b, t, -1, 3 * self.hd).transpose(1, 2)
    q, k, v = qkv.split(self.hd, dim=-1)
    k = GatherSeq.apply(k, group, 2)         # [b, heads, seq, hd]: every rank's keys, rank by rank
    v = GatherSeq.apply(v, group, 2)
    seq = t * cp
    mask = positions(seq, cp, r, x.device)[:, None] >= gathered_positions(seq, cp, x.device)[None, :]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
    att = att.masked_fill(~mask, float("-inf"))
    att = self.attn_drop(F.softmax(att, dim=-1))
    y = (att @ v).transpose(1, 2).reshape(b, t, -1)
    return self.resid_drop(self.proj(y))


def apply(model, group, cp: int, rank: int) -> int:
    """Rewrite the zoo GPT's attention and embeddings for cp ranks; returns the attention modules
    rewritten.  PlanError for a model without them."""
    from ..models.gpt import Attention, Embed
    n = 0
    for m in model.modules():
        if isinstance(m, Attention):
            m._sapp_cp = (group, cp, rank)
            m.forward = types.MethodType(_attention_forward, m)
            n += 1
        elif isinstance(m, Embed):
            m._sapp_cp = (cp, rank)
            m.forward = types.MethodType(_embed_forward, m)
    if not n:
        raise PlanError(f"cp={cp} is emitted for the zoo GPT's attention (sapp.models.gpt) only; "
                        f"{type(model).__name__} has none: drop cp")
    return n


def observed_cp(modules) -> int:
    """The cp degree the running attention modules use (1 when none was rewritten)."""
    for mod in modules:
        for m in mod.modules():
            st = getattr(m, "_sapp_cp", None)
            if st is not None and len(st) == 3:
                return st[1]
    return 1


def cp_groups(world: int, cp: int):
    """(every cp group, in rank order).  Ranks dp_i·cp .. dp_i·cp + cp-1 share samples (pp = tp = 1).
    Every rank creates every group, as torch.distributed requires."""
    return [dist.new_group(list(range(s, s + cp))) for s in range(0, world, cp)]


# ---- the program -------------------------------------------------------------------------------------
class CPProgram(Program):
    """Program whose data shard is this rank's rows (dp) and tokens (cp).  `dp` is the gradient
    group dp·cp (what the emitter wraps); `cp`, `dp_only`, `cp_rank` the split of it."""

    @property
    def dp_rank(self) -> int:
        return self.coords[1] // self.cp

    @property
    def data_ranks(self) -> int:
        return self.dp_only

    def _local(self, rows):
        return self.shard_tokens(rows)

    def shard_tokens(self, *tensors):
        """This cp rank's tokens (load-balanced chunks) of [batch, seq, ...] tensors already cut to
        its dp rows; tensors without a sequence axis pass unchanged."""
        out = []
        for t in tensors:
            if isinstance(t, (tuple, list)):
                out.append(type(t)(self.shard_tokens(*t)) if len(t) != 1 else (self.shard_tokens(t[0]),))
                continue
            out.append(shard_sequence(t, self.cp, self.cp_rank) if t.dim() >= 2 else t)
        return out[0] if len(out) == 1 else tuple(out)
