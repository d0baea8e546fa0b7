"""Capture leaves the user's module as it found it (sapp/capture/state.py).  A forward that caches on
its module -- x-transformers' ALiBi registers its bias as a buffer on the first call, rotary
embeddings keep tables as attributes -- ran under torch.export with fake tensors, so the user's model
held a FakeTensor after `sapp.api.capture_graph` (its next real forward returned a symbolic value),
and the emitter's shape audit, capturing the same module a second time at one rank's shapes, traced
the cached path and refused a plan the search had written."""
import torch
from torch import nn

from sapp.api import capture_graph


class CachedBias(nn.Module):
    """ALiBi's pattern: a bias built on the first call, kept as a buffer, sliced afterwards; and a
    table kept as a plain attribute."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("bias", None, persistent=False)

    def forward(self, x):
        n = x.shape[1]
        if self.bias is not None and self.bias.shape[-1] >= n:
            bias = self.bias[:n]
        else:
            bias = torch.arange(n, device=x.device, dtype=x.dtype) * 0.1
            self.register_buffer("bias", bias, persistent=False)
        self.table = bias.sum()
        return self.proj(x) + bias[:, None]


def test_capture_restores_cached_buffers_and_attributes():
    torch.manual_seed(0)
    m = CachedBias()
    x = torch.randn(2, 4, 8)
    ref = m(x).detach()
    m.bias, table = None, vars(m).pop("table")
    assert isinstance(table, torch.Tensor)
    capture_graph(m, (x,), lambda out, y: (out - y).pow(2).mean(), torch.zeros(2, 4, 8))
    assert m.bias is None and "table" not in vars(m)          # as before the trace
    assert [n for n, _ in m.named_buffers()] == [] and set(dict(m.named_parameters())) == {"proj.weight", "proj.bias"}
    out = m(x)                                                # a real forward: real values, as before
    assert type(out) is torch.Tensor and torch.equal(out, ref)


def test_two_captures_trace_the_same_ops():
    """The second capture (the shape audit's) sees the module the first one saw."""
    from sapp.capture import capture
    m = CachedBias()
    x = torch.randn(2, 4, 8)
    a, b = capture(m, (x,)), capture(m, (x,))
    assert [n.target for n in a.nodes.values()] == [n.target for n in b.nodes.values()]
