"""Head counts held by einops layers: x-transformers' attention splits q by `Rearrange('b n (h d) -> b h n
d', h=heads)` and k, v by `d=dim_head`, so at one tensor-parallel rank's shapes q kept the global head
count, its head dim halved and the attention's einsum met k's whole head dim (64 against 32): every
tp2 plan of five x-transformers families was refused.  The shape audit now sets such a layer's axis
length to the rank's share, as it does an int attribute, and the split runs."""
import pytest
import torch
from torch import nn

einops = pytest.importorskip("einops")
from einops.layers.torch import Rearrange  # noqa: E402

from sapp.emit.checks import shape_audit  # noqa: E402
from sapp.errors import PlanError  # noqa: E402

DIM, HEADS, DIM_HEAD = 32, 4, 8


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        inner = HEADS * DIM_HEAD
        self.to_q, self.to_k, self.to_v = (nn.Linear(DIM, inner, bias=False) for _ in range(3))
        self.split_q = Rearrange("b n (h d) -> b h n d", h=HEADS)
        self.split_kv = Rearrange("b n (h d) -> b h n d", d=DIM_HEAD)
        self.merge = Rearrange("b h n d -> b n (h d)")
        self.to_out = nn.Linear(inner, DIM)

    def forward(self, x):
        q, k, v = self.split_q(self.to_q(x)), self.split_kv(self.to_k(x)), self.split_kv(self.to_v(x))
        attn = torch.einsum("b h i d, b h j d -> b h i j", q, k).softmax(dim=-1)
        return self.to_out(self.merge(torch.einsum("b h i j, b h j d -> b h i d", attn, v)))


STYLES = {"to_q": "colwise", "to_k": "colwise", "to_v": "colwise", "to_out": "rowwise"}
GROUPS = [["to_q", "to_k", "to_v", "to_out"]]


def test_an_einops_head_count_is_set_to_the_rank_share():
    m, x, notes = Attention(), torch.randn(2, 5, DIM), []
    assert shape_audit.check(m, STYLES, GROUPS, 2, (x,), notes) > 0
    assert m.split_q.axes_lengths == {"h": HEADS // 2} and m.split_q._axes_lengths == (("h", HEADS // 2),)
    assert m.split_kv.axes_lengths == {"d": DIM_HEAD}          # a head's width is not split
    assert any("Rearrange.split_q:h 4 -> 2" in n for n in notes), notes
    y = m.split_q(torch.randn(2, 5, HEADS // 2 * DIM_HEAD))    # the layer runs with the new length
    assert y.shape == (2, HEADS // 2, 5, DIM_HEAD)


def test_without_it_the_audit_refuses():
    m, x = Attention(), torch.randn(2, 5, DIM)
    with pytest.raises(PlanError, match="cannot run at one rank's shapes"):
        shape_audit.check(m, STYLES, GROUPS, 2, (x,), [], fix=False)
