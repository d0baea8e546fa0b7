"""torch's nn.MultiheadAttention split by heads over the tp group (plan style "heads", found by
sapp/search/tp_mha.py).

The module applies its packed `in_proj_weight` and `out_proj.weight` in its own forward
(F.multi_head_attention_forward), which reads the whole model's embed_dim off the input and checks it
against its own, so it cannot run with local weights.  Here a rank holds its heads: in_proj's rows put
in rank order (q, k and v of this rank's heads: sapp/emit/tp/fused.py's order for three pieces of E)
and sharded Shard(0), out_proj's weight Shard(1) (its input columns, the same heads), its bias whole;
the module's forward is replaced by `local_forward`, F.multi_head_attention_forward's own SDPA path
(need_weights=False) over this rank's H / tp heads: the input enters through `_Copy` (its gradient
summed over tp), the out-projection's partial sums leave through `_Reduce` (all-reduced), then the
bias.  Megatron's attention, in torch's ops.  Checkpoints keep the model's row order
(`entries` for sapp/emit/runtime/fused_checkpoint.py)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from . import fused


def unsupported(mod, tp: int) -> str:
    """'' when `mod` can be split by heads `tp` ways, else why not (one line)."""
    if not isinstance(mod, nn.MultiheadAttention):
        return f"a {type(mod).__name__}, not an nn.MultiheadAttention"
    if not mod._qkv_same_embed_dim or mod.in_proj_weight is None:
        return "separate q/k/v projection weights (kdim / vdim differ from embed_dim)"
    if mod.bias_k is not None or mod.add_zero_attn:
        return "add_bias_kv / add_zero_attn (keys shared by every head)"
    if mod.num_heads % tp:
        return f"{mod.num_heads} heads, which tp={tp} does not divide"
    return ""


class _Copy(torch.autograd.Function):
    """Identity forward; the gradient summed over the tp group (each rank's heads add their part)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _Reduce(torch.autograd.Function):
    """The out-projection's partial sums all-reduced forward; the gradient passes as is."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


def _local(p):
    return p.to_local() if hasattr(p, "to_local") else p


def local_forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                  average_attn_weights=True, is_causal=False):
    """nn.MultiheadAttention.forward on this rank's heads (F.multi_head_attention_forward's SDPA
    path, step for step, with num_heads the rank's share)."""
    if need_weights:
        raise RuntimeError("nn.MultiheadAttention split by heads (tp) runs with need_weights=False only: "
                           "the averaged attention weights need every head; pin tp=1 or pass need_weights=False")
    if query.dim() != 3:
        raise RuntimeError("nn.MultiheadAttention split by heads (tp) takes batched 3-D inputs only")
    group = self.sapp_tp_group
    if self.batch_first:            # as torch does: a self-attention's one input stays one tensor
        same_kv, same_qk = key is value, query is key
        query, key, value = (x.transpose(1, 0) for x in (query, key, value))
        if same_kv:
            value = key
            if same_qk:
                query = key
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    key_padding_mask = F._canonical_mask(mask=key_padding_mask, mask_name="key_padding_mask",
                                         other_type=F._none_or_dtype(attn_mask), other_name="attn_mask",
                                         target_type=query.dtype)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint (nn.MultiheadAttention)")
    if is_causal and key_padding_mask is None:
        attn_mask = None
    else:
        attn_mask = F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="",
                                      target_type=query.dtype, check_other=False)
        if key_padding_mask is not None:
            is_causal = False
    heads, head_dim = self.num_heads // self.sapp_tp, embed_dim // self.num_heads
    w, b = _local(self.in_proj_weight), _local(self.in_proj_bias) if self.in_proj_bias is not None else None
    q, k, v = _project(query, key, value, w, b, group)
    if attn_mask is not None:
        attn_mask = _local_mask(attn_mask, bsz, self.num_heads, heads, self.sapp_tp_rank)
    q = q.view(tgt_len, bsz * heads, head_dim).transpose(0, 1)
    k = k.view(k.shape[0], bsz * heads, head_dim).transpose(0, 1)
    v = v.view(v.shape[0], bsz * heads, head_dim).transpose(0, 1)
    if key_padding_mask is not None:
        kpm = key_padding_mask.view(bsz, 1, 1, src_len).expand(-1, heads, -1, -1).reshape(bsz * heads, 1, src_len)
        attn_mask = kpm if attn_mask is None else attn_mask + kpm
    dropout_p = self.dropout if self.training else 0.0
    if attn_mask is not None:
        attn_mask = attn_mask.unsqueeze(0) if attn_mask.size(0) == 1 and attn_mask.dim() == 3 \
            else attn_mask.view(bsz, heads, -1, src_len)
    q, k, v = (t.view(bsz, heads, t.shape[1], head_dim) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
    out = out.permute(2, 0, 1, 3).contiguous().view(bsz * tgt_len, heads * head_dim)
    out = _Reduce.apply(F.linear(out, _local(self.out_proj.weight)), group)
    if self.out_proj.bias is not None:
        out = out + _local(self.out_proj.bias)
    out = out.view(tgt_len, bsz, out.size(1))
    return (out.transpose(1, 0) if self.batch_first else out), None


def _project(query, key, value, w, b, group):
    """q, k, v of this rank's heads from rows in rank order [q_r; k_r; v_r] (torch's
    _in_projection_packed on the local rows)."""
    e = w.shape[0] // 3
    if key is value and query is key:
        qkv = F.linear(_Copy.apply(query, group), w, b)
        return qkv.unflatten(-1, (3, e)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
    bq, bk, bv = b.split(e) if b is not None else (None, None, None)
    wq, wk, wv = w.split(e)
    q = F.linear(_Copy.apply(query, group), wq, bq)
    kin = _Copy.apply(key, group)
    k = F.linear(kin, wk, bk)
    v = F.linear(kin if value is key else _Copy.apply(value, group), wv, bv)
    return q, k, v


def _local_mask(mask, bsz: int, num_heads: int, heads: int, rank: int):
    """torch's 2-D mask as torch reshapes it; a 3-D one (one per batch and head) cut to this rank's heads."""
    if mask.dim() == 2:
        return mask.unsqueeze(0)
    if mask.dim() != 3:
        raise RuntimeError(f"attn_mask's dimension {mask.dim()} is not supported")
    m = mask.view(bsz, num_heads, *mask.shape[1:])[:, rank * heads:(rank + 1) * heads]
    return m.reshape(bsz * heads, *mask.shape[1:])


def apply(module: nn.Module, names: list, tp_mesh, permuted: dict = None) -> list:
    """Split the nn.MultiheadAttention modules `names` of `module` by heads over `tp_mesh` (in place)."""
    import types
    from torch.distributed.tensor import Shard, distribute_tensor
    tp, rank = tp_mesh.size(), tp_mesh.get_local_rank()
    done = []
    for name in names:
        mod = module.get_submodule(name)
        why = unsupported(mod, tp)
        if why:
            raise RuntimeError(f"tp_modules[{name!r}] is 'heads' but {name} has {why}")
        e = mod.embed_dim
        idx = torch.tensor(fused.order([e, e, e], tp), device=mod.in_proj_weight.device)

        def shard(t, dim, perm=False):
            data = t.detach().index_select(0, idx) if perm else t.detach()
            return nn.Parameter(distribute_tensor(data.contiguous(), tp_mesh, [Shard(dim)]),
                                requires_grad=t.requires_grad)
        with torch.no_grad():
            mod.in_proj_weight = shard(mod.in_proj_weight, 0, True)
            if mod.in_proj_bias is not None:
                mod.in_proj_bias = shard(mod.in_proj_bias, 0, True)
            mod.out_proj.weight = shard(mod.out_proj.weight, 1)
        mod.sapp_tp, mod.sapp_tp_rank, mod.sapp_tp_group = tp, rank, tp_mesh.get_group()
        mod.forward = types.MethodType(local_forward, mod)
        if permuted is not None:
            permuted[f"{name}.in_proj_weight"] = (0, (e, e, e), tp)
            if mod.in_proj_bias is not None:
                permuted[f"{name}.in_proj_bias"] = (0, (e, e, e), tp)
        done.append(name)
    return done


def observed(module: nn.Module) -> tuple:
    """({name: "heads"} of the modules split here, {their out_proj}) for the manifest: an
    nn.MultiheadAttention whose in_proj_weight is sharded over "tp"."""
    heads, inner = {}, set()
    for name, m in module.named_modules():
        w = getattr(m, "in_proj_weight", None) if isinstance(m, nn.MultiheadAttention) else None
        mesh = getattr(w, "device_mesh", None)
        if mesh is not None and "tp" in (getattr(mesh, "mesh_dim_names", None) or ()):
            heads[name] = "heads"
            inner.add(f"{name}.out_proj" if name else "out_proj")
    return heads, inner
