"""Context parallelism emitted (plan `parallel.cp` > 1), as sapp/costmodel/context.py prices it.

    cp ranks share every sample: each holds 2 of the sequence's 2·cp chunks (rank r: chunks r and
    2cp-1-r, so causal work is even), runs the whole layer on its tokens, and all-gathers the keys
    and values of the whole sequence before attention (sapp/emit/cp/cp_attention.py: all-gather
    forward, the gradients' reduce-scatter backward).  Queries stay local; the causal mask compares
    global positions.  Position ids are the tokens' global positions.  Parameters are replicated over
    cp, and the gradients are averaged over dp x cp: the emitter's data-parallel group is dp·cp ranks
    (mesh order pp, dp, cp, tp; ZeRO / FSDP2 shard over it), and each rank's loss is the mean over its
    tokens, so the average of the dp·cp means is the global mean.  Under tensor parallelism a cp group
    is the ranks of one (pp, dp, tp) coordinate, tp apart; K/V are gathered on this rank's heads.

What it covers: the zoo GPT (eager or SDPA attention, learned positions) and Llama (SDPA, rotary,
grouped-query), and Hugging Face models whose attention runs through transformers' attention
interface (sapp/emit/cp/cp_hf.py: Llama, Qwen2, Mistral, ...), with pp = 1, any tp and ZeRO 0-3.  A
pipeline or host placement with cp is refused before training (`check_plan`), as is a model whose
attention cannot be rewritten (`apply`), each with a PlanError saying what to change.  On gloo (no
reduce-scatter) the backward is an all-reduce keeping this rank's chunk: the same numbers, more bytes
than priced."""
from __future__ import annotations

import math
import types

import torch
import torch.distributed as dist
from torch.nn import functional as F

from ...costmodel.context import check_sequence, chunk_positions
from ...errors import PlanError
from .cp_attention import Layout, _resolve, fused_attention, gather_kv


# ---- plan checks ---------------------------------------------------------------------------------
def check_plan(plan) -> int:
    """The plan's cp degree, refusing combinations this emitter does not run."""
    par = plan.parallel
    cp = par.get("cp", 1)
    if cp <= 1:
        return 1
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


def shard_sequence(t: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This cp rank's tokens of a [batch, seq, ...] tensor (inputs, labels)."""
    return t.index_select(dim, positions(t.shape[dim], cp, rank, t.device))


# ---- module rewrites (the zoo's models; Hugging Face models: sapp/emit/cp/cp_hf.py) ----------------------
def _embed_forward(self, ids):
    lay = self._sapp_cp_pos
    return self.drop(self.tok(ids) + self.pos(lay.positions(ids.shape[1], ids.device)))


def _gpt_attention_forward(self, x):
    b, t, _ = x.shape
    lay = self._sapp_cp
    qkv = self.qkv(x).view(b, t, -1, 3 * self.hd).transpose(1, 2)
    q, k, v = qkv.split(self.hd, dim=-1)
    if not getattr(self, "_sapp_checkpointed", False):
        # q on its own storage: saved as a view of the fused qkv output it would keep this rank's k
        # and v alive beside the gathered ones.  (Under selective recomputation the qkv output is
        # kept anyway, as a GEMM output: there the copy would only add a tensor.)
        q = q.contiguous()
    k, v = gather_kv(k, lay), gather_kv(v, lay)     # [b, heads, seq, hd]: every rank's, rank by rank
    if self.kind == "sdpa":
        y = fused_attention(q, k, v, lay, dropout_p=self.p if self.training else 0.0)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, -1)))
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
    att = att.masked_fill(~lay.allowed(t, x.device), float("-inf"))
    att = self.attn_drop(F.softmax(att, dim=-1))
    y = (att @ v).transpose(1, 2).reshape(b, t, -1)
    return self.resid_drop(self.proj(y))


def _llama_attention_forward(self, x):
    from ...models.llama import rotate
    b, t, _ = x.shape
    lay = self._sapp_cp
    q = self.wq(x).view(b, t, -1, self.hd).transpose(1, 2)
    k = self.wk(x).view(b, t, -1, self.hd).transpose(1, 2)
    v = self.wv(x).view(b, t, -1, self.hd).transpose(1, 2)
    pos = lay.positions(t, x.device)                # rotary angles of the tokens' global positions
    cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    # the key/value heads are gathered un-repeated (what is priced); the kernel shares them (GQA)
    y = fused_attention(q, gather_kv(k, lay), gather_kv(v, lay), lay)
    return self.wo(y.transpose(1, 2).reshape(b, t, -1))


def apply(model, group, cp: int, rank: int) -> int:
    """Rewrite the attention (and learned positions) of `model` for cp ranks; returns the attention
    modules rewritten.  The zoo GPT (eager or SDPA attention) and Llama are rewritten here, Hugging
    Face models through transformers' attention interface (cp_hf).  PlanError for a model with none."""
    from ...models import gpt, llama
    from . import cp_hf
    lay = Layout(group, cp, rank)
    n = 0
    for m in model.modules():
        if isinstance(m, gpt.Attention):
            m.forward = types.MethodType(_gpt_attention_forward, m)
        elif isinstance(m, llama.Attention):
            m.forward = types.MethodType(_llama_attention_forward, m)
        elif isinstance(m, gpt.Embed):
            m._sapp_cp_pos = lay
            m.forward = types.MethodType(_embed_forward, m)
            continue
        else:
            continue
        m._sapp_cp = lay
        n += 1
    if not n:
        n = cp_hf.apply(model, lay)
    if not n:
        raise PlanError(f"cp={cp} is emitted for the zoo GPT / Llama and Hugging Face models whose attention "
                        f"runs through transformers' attention interface; {type(model).__name__} has neither: "
                        f"drop cp")
    return n


def observed_cp(modules) -> int:
    """The cp degree the running attention uses (1 when none exchanges K/V): read off the rewritten
    attention modules, or, in a traced pipeline stage, off the K/V all-gathers its graph calls."""
    gather = torch.ops.sapp.cp_gather.default
    for mod in modules:
        for m in mod.modules():
            lay = getattr(m, "_sapp_cp", None)
            if isinstance(lay, Layout):
                return lay.cp
            graph = getattr(m, "graph", None)
            for node in (graph.nodes if isinstance(graph, torch.fx.Graph) else ()):
                if node.op == "call_function" and node.target is gather:
                    return dist.get_world_size(_resolve(node.args[1]))
    return 1


def cp_group(rank: int, pp: int, dp: int, cp: int, tp: int):
    """This rank's cp group.  Mesh (pp, dp, cp, tp), rank = ((pp_i·dp + dp_i)·cp + cp_i)·tp + tp_i: the
    ranks of one (pp_i, dp_i, tp_i) share samples.  Every rank creates every group in the same order,
    as torch.distributed requires."""
    mine = None
    for p in range(pp):
        for d in range(dp):
            for t in range(tp):
                ranks = [((p * dp + d) * cp + c) * tp + t for c in range(cp)]
                g = dist.new_group(ranks)
                if rank in ranks:
                    mine = g
    return mine
