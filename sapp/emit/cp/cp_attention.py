"""Attention over a context-parallel sequence (plan `parallel.cp` > 1): the arithmetic, model-free.

A cp rank holds 2 of the sequence's 2·cp equal chunks (rank r: chunks r and 2cp-1-r; see
sapp/costmodel/context.py), keeps its queries and all-gathers the keys and values of the whole
sequence (`gather_kv`: all-gather forward, the gradients' reduce-scatter backward).  What each rank
then computes, as the cost model prices it (1/cp of the causal pairs, K/V exchanged once a layer):

- fused attention (SDPA models): one kernel call per local chunk g, over the keys of chunks 0..g in
  global order, causal aligned to the bottom right (`torch.nn.attention.bias.causal_lower_right`:
  query i of the chunk sees every earlier chunk and keys 0..i of its own).  No mask tensor is made on
  a GPU (flash / memory-efficient kernels take the alignment as a flag) and the masked blocks above
  the diagonal are skipped, so a rank does the work of its causal pairs, not of a full [2L, S] block.
  Grouped-query K/V stay un-repeated (`enable_gqa`), which is what is gathered and priced.
- eager attention (models that write q·kᵀ, mask, softmax, ·v out): the same ops on the gathered keys
  with the single-device mask restricted to this rank's rows (`allowed`), so the saved s² terms are
  what the eager pricing counts.

Position bookkeeping: gathered tensors come rank by rank (rank 0's two chunks, rank 1's, ...);
`Layout.order` sorts them into global order, `Layout.key_pos` gives their global positions."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn import functional as F

from ...costmodel.context import balanced_chunks, check_sequence
from ...errors import PlanError


# The K/V exchange as two custom operators (torch.library): eager code calls them like any op, and
# torch.export keeps them as single nodes, so a pipeline stage traced from a cp-prepared model runs
# the same exchange (sapp/emit/pp/pipe.py).  The group travels by name (ProcessGroup.group_name).
@torch.library.custom_op("sapp::cp_gather", mutates_args=())
def _gather(x: torch.Tensor, group_name: str, dim: int) -> torch.Tensor:
    group = _resolve(group_name)
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


@_gather.register_fake
def _(x, group_name, dim):
    shape = list(x.shape)
    shape[dim] *= _world_of(group_name)
    return x.new_empty(shape)


@torch.library.custom_op("sapp::cp_reduce_scatter", mutates_args=())
def _reduce_scatter(g: torch.Tensor, group_name: str, dim: int) -> torch.Tensor:
    """This rank's part along `dim` of `g` summed over the group."""
    group = _resolve(group_name)
    n, r = dist.get_world_size(group), dist.get_rank(group)
    g = g.contiguous()
    if dist.get_backend(group) == "nccl":
        chunks = [c.contiguous() for c in g.chunk(n, dim=dim)]
        out = torch.empty_like(chunks[0])
        dist.reduce_scatter(out, chunks, group=group)
        return out
    dist.all_reduce(g, group=group)          # gloo has no reduce-scatter: all-reduce, keep this rank's part
    return g.chunk(n, dim=dim)[r].contiguous()


@_reduce_scatter.register_fake
def _(g, group_name, dim):
    shape = list(g.shape)
    shape[dim] //= _world_of(group_name)
    return g.new_empty(shape)


def _gather_backward(ctx, grad):
    return torch.ops.sapp.cp_reduce_scatter(grad, ctx.group_name, ctx.dim), None, None


def _gather_setup(ctx, inputs, output):
    ctx.group_name, ctx.dim = inputs[1], inputs[2]


_gather.register_autograd(_gather_backward, setup_context=_gather_setup)


def _resolve(name: str):
    from torch.distributed.distributed_c10d import _resolve_process_group
    return _resolve_process_group(name)


def _world_of(name: str) -> int:
    return dist.get_world_size(_resolve(name))


def _tracing() -> bool:
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def _fake(t) -> bool:
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(t)


class Layout:
    """Where this cp rank's tokens and the gathered keys sit in the whole sequence (cached per
    (local length, device): a model calls it once a layer)."""

    def __init__(self, group, cp: int, rank: int):
        self.group, self.cp, self.rank = group, cp, rank
        self._cache = {}

    def _get(self, t: int, device):
        key = (t, str(device))
        if key not in self._cache or _tracing():
            seq = t * self.cp
            if not check_sequence(seq, self.cp):
                raise PlanError(f"a cp={self.cp} rank holds {t} tokens, which is not two equal chunks; use a "
                                f"sequence length divisible by {2 * self.cp}")
            # built from aranges (no tensor constants): in a traced stage these are position-only
            # ops every stage recomputes (sapp/emit/pp/stage_local.py) instead of receiving them
            mine = self._chunks(seq, self.rank, device)
            keys = torch.cat([self._chunks(seq, r, device) for r in range(self.cp)])
            got = (mine, keys, torch.argsort(keys))
            if _tracing() or _fake(got[0]):        # traced (pipeline stages): constants of the graph
                return got
            self._cache[key] = got
        return self._cache[key]

    def _chunks(self, seq: int, rank: int, device) -> torch.Tensor:
        """Global positions of `rank`'s two chunks (sapp.costmodel.context.chunk_positions)."""
        c = seq // (2 * self.cp)
        return torch.cat([torch.arange(k * c, (k + 1) * c, device=device) for k in balanced_chunks(self.cp, rank)])

    def positions(self, t: int, device) -> torch.Tensor:
        """Global positions of this rank's t local tokens."""
        return self._get(t, device)[0]

    def key_pos(self, t: int, device) -> torch.Tensor:
        """Global positions along a gathered sequence (rank by rank)."""
        return self._get(t, device)[1]

    def order(self, t: int, device) -> torch.Tensor:
        """Index that sorts a gathered sequence into global order."""
        return self._get(t, device)[2]

    def allowed(self, t: int, device) -> torch.Tensor:
        """[t, t·cp] bool: the causal mask of this rank's queries against the gathered keys."""
        return self.positions(t, device)[:, None] >= self.key_pos(t, device)[None, :]


def gather_kv(x: torch.Tensor, layout: Layout, dim: int = 2) -> torch.Tensor:
    """Every cp rank's part of `x` along `dim` (the sequence), rank by rank; backward: the gradient
    of this rank's part summed over the group (a reduce-scatter)."""
    return torch.ops.sapp.cp_gather(x, layout.group.group_name, dim)


def fused_attention(q, k, v, layout: Layout, *, causal: bool = True, scale=None, dropout_p: float = 0.0):
    """SDPA for this rank's queries q [b, heads, t, d] against gathered k, v [b, kv_heads, t·cp, d]
    (rank by rank, un-repeated).  Returns [b, heads, t, d] in q's local token order."""
    t = q.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if not causal:          # every query sees every key: one call, key order irrelevant
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, enable_gqa=gqa)
    from torch.nn.attention.bias import causal_lower_right
    order = layout.order(t, q.device)
    k, v = k.index_select(2, order), v.index_select(2, order)
    L = t // 2
    out = []
    for j, g in enumerate((layout.rank, 2 * layout.cp - 1 - layout.rank)):
        n = (g + 1) * L                      # keys of chunks 0..g
        qc = q[:, :, j * L:(j + 1) * L]
        if _tracing() or _fake(q):
            # a traced pipeline stage: torch.export cannot carry the CausalBias subclass, so the
            # stage keeps the same pattern as a boolean constant (on a GPU the memory-efficient
            # kernel with a mask: the same pairs, and the diagonal block's masked half)
            mask = torch.ones(L, n, dtype=torch.bool, device=q.device).tril(n - L)
        else:
            mask = causal_lower_right(L, n)
        y = F.scaled_dot_product_attention(qc, k[:, :, :n], v[:, :, :n], attn_mask=mask,
                                           dropout_p=dropout_p, scale=scale, enable_gqa=gqa)
        out.append(y.transpose(1, 2))
    # joined token-major ([b, t, heads, d], the layout attention kernels write): the caller's
    # transpose(1, 2).reshape for the output projection is then a view, not one more copy
    return torch.cat(out, dim=1).transpose(1, 2)
