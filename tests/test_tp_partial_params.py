"""Which replicated weights get only part of their gradient on a tp rank (shape_audit.partial_params):
one an op inside a sharded region applies across the split axis it lacks (Qwen3's q_norm over
head_dim on this rank's heads), directly or through weight-only arithmetic (Gemma's `1 + w`), and not
the weights of the region's own linears nor a norm before the region.  A weight used both there and
on whole tensors outside cannot be fixed by summing over tp and is refused.  Capture only, no ranks."""
import pytest
import torch
from torch import nn

from sapp.errors import PlanError

D, H, HD, SEQ, B = 32, 4, 8, 8, 2


class Attn(nn.Module):
    def __init__(self, one_plus=False, reuse=False):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.q, self.v, self.o = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.head_w = nn.Parameter(torch.ones(HD))
        self.one_plus, self.reuse = one_plus, reuse

    def forward(self, x):
        h = self.ln(x)
        q = self.q(h).view(B, SEQ, H, HD)
        w = (1.0 + self.head_w) if self.one_plus else self.head_w
        q = (q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * w).transpose(1, 2)
        v = self.v(h).view(B, SEQ, H, HD).transpose(1, 2)
        a = torch.softmax(q @ v.transpose(-1, -2), dim=-1) @ v
        out = x + self.o(a.transpose(1, 2).reshape(B, SEQ, D))
        if self.reuse:       # the same weight on whole tensors outside the region
            out = out * self.head_w.mean()
        return out


def _partial(model):
    from sapp.capture import capture
    from sapp.emit.checks.shape_audit import partial_params
    from sapp.search import tp_layout
    graph = capture(model, (torch.randn(B, SEQ, D),))
    regions = [r for r in tp_layout.regions(graph, 2) if not r.why and r.closers]
    assert regions, "the q/v -> o region should be valid"
    return partial_params(graph, regions)


@pytest.mark.parametrize("one_plus", [False, True])
def test_a_head_norm_weight_inside_the_region_is_partial(one_plus):
    got = _partial(Attn(one_plus=one_plus))
    assert got == ["head_w"], got            # not the linears' weights, not ln (before the region)


def test_a_weight_also_used_outside_the_region_is_refused():
    with pytest.raises(PlanError, match="head_w"):
        _partial(Attn(reuse=True))
