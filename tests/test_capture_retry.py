"""Capture's export retries (sapp/capture/retry.py), each on a small module of ours written like the
transformers code that needed it; each of these failed to capture before the retries."""
import sys
import types

import pytest
import torch

from sapp.capture import capture
from sapp.errors import CaptureError

B, S, K = 4, 6, 8


class CpuTensorMeetsMeta(torch.nn.Module):
    """XLNet-like: a position tensor created without `device=` (on the cpu) meets the activations."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(K, K)

    def forward(self, x):
        pos = torch.arange(x.shape[1], dtype=x.dtype)[:, None]          # cpu, whatever x's device
        return self.lin(x) + pos


def test_a_cpu_tensor_meeting_meta_parameters_is_captured_on_meta():
    with torch.device("meta"):
        m = CpuTensorMeetsMeta()
    g = capture(m, (torch.randn(B, S, K),))
    assert not g.meta["unknown_ops"]
    mm = [n for n in g.nodes.values() if n.kind == "matmul"]
    assert len(mm) == 1 and mm[0].flops == 2 * B * S * K * K
    assert any(n.kind == "elementwise" and n.out.shape == (B, S, K) for n in g.nodes.values())


def test_the_error_past_a_cpu_tensor_is_the_one_reported():
    """ImageGPT's catalogue row: past the cpu tensor (retried on meta) its loss got targets of the
    wrong shape; the refusal named the device mismatch the retry had already solved."""
    with torch.device("meta"):
        m = CpuTensorMeetsMeta()
    with pytest.raises(CaptureError) as e:
        capture(m, (torch.randn(B, S, K),), target=torch.zeros(B * S * 2, dtype=torch.long),
                loss_fn=lambda out, y: torch.nn.functional.cross_entropy(out.reshape(-1, K), y))
    assert "DeviceMismatch" not in str(e.value) and "batch_size" in str(e.value)


def _fake_hf_module():
    """A module named like transformers' own, holding the compile check HF models import."""
    mod = types.ModuleType("transformers.models.sapp_retry_test")
    mod.is_torchdynamo_compiling = lambda: torch.compiler.is_compiling()

    class SkipsMaskWhenCompiling(torch.nn.Module):      # Switch Transformers / LongT5's encoder stack
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(K, K)

        def forward(self, x, attention_mask=None):
            if attention_mask is None and not mod.is_torchdynamo_compiling():
                attention_mask = torch.ones(x.shape[:2], device=x.device)
            return self.lin(x) * attention_mask[:, :, None]
    SkipsMaskWhenCompiling.__module__ = mod.__name__
    mod.SkipsMaskWhenCompiling = SkipsMaskWhenCompiling
    return mod


def test_hf_compile_only_branch_is_traced_as_eager_runs_it(monkeypatch):
    mod = _fake_hf_module()
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    m = mod.SkipsMaskWhenCompiling()
    assert m(torch.randn(B, S, K)).shape == (B, S, K)                 # eager runs
    g = capture(m, (torch.randn(B, S, K),))
    assert not g.meta["unknown_ops"]
    assert sum(1 for n in g.nodes.values() if n.kind == "matmul") == 1
    assert mod.is_torchdynamo_compiling.__name__ == "<lambda>" and not mod.is_torchdynamo_compiling()


class BranchOnValues(torch.nn.Module):
    """FSMT-like: a Python branch on the inputs' values (`if not padding_mask.any()`), and layerdrop's
    `torch.rand([]) < p` per block (M2M100, NLLB-MoE, SeamlessM4T)."""

    def __init__(self, layerdrop=0.0):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(K, K) for _ in range(2))
        self.emb = torch.nn.Embedding(16, K)
        self.layerdrop = layerdrop

    def forward(self, ids):
        h = self.emb(ids)
        pad = ids.eq(1)
        if pad.any():                                 # the mask only when there is padding
            h = h.masked_fill(pad[:, :, None], 0.0)
        for b in self.blocks:
            if self.training and torch.rand([]) < self.layerdrop:
                continue
            h = b(h)
        return h


def test_a_branch_on_values_follows_the_example_values():
    m = BranchOnValues()
    padded = torch.randint(2, 16, (B, S))
    padded[0, -1] = 1
    g = capture(m, (padded,))
    assert any("masked_fill" in n.target for n in g.nodes.values())
    assert sum(1 for n in g.nodes.values() if n.kind == "matmul") == 2        # layerdrop 0: both blocks
    g = capture(m, (torch.randint(2, 16, (B, S)),))                          # no padding: no mask
    assert not any("masked_fill" in n.target for n in g.nodes.values())


def test_layerdrop_capture_is_the_same_every_time():
    m = BranchOnValues(layerdrop=0.5)
    ids = torch.randint(2, 16, (B, S))
    runs = [sorted((n.target, n.out.shape) for n in capture(m, (ids,)).nodes.values()) for _ in range(2)]
    assert runs[0] == runs[1]


def _graph_rows(g):
    return sorted((n.kind, n.target, n.out.shape, n.flops) for n in g.nodes.values())


def test_a_branch_on_values_of_a_meta_model_follows_its_real_inputs():
    """`sapp search` builds a model on meta; its real example inputs still decide the branch (the
    parameters stand in for the trace only): the graph is the one the real model gives."""
    padded = torch.randint(2, 16, (B, S))
    padded[0, -1] = 1
    torch.manual_seed(0)
    real = BranchOnValues()
    with torch.device("meta"):
        m = BranchOnValues()
    for ids in (padded, torch.randint(2, 16, (B, S))):
        g = capture(m, (ids,))
        assert _graph_rows(g) == _graph_rows(capture(real, (ids,)))
        assert any("masked_fill" in n.target for n in g.nodes.values()) == bool(ids.eq(1).any())
        assert {p.shape for p in g.params.values()} == {(16, K), (K, K), (K,)}
    assert all(p.device.type == "meta" for p in m.parameters())        # swapped back after the trace


def test_a_branch_on_values_of_a_meta_model_with_meta_inputs_is_refused_in_one_line():
    with torch.device("meta"):
        m = BranchOnValues()
    with pytest.raises(CaptureError) as e:
        capture(m, (torch.randint(0, 16, (B, S), device="meta"),))
    msg = str(e.value)
    assert "\n" not in msg and "pass real example inputs (not meta)" in msg


def test_a_branch_on_values_of_a_meta_model_too_large_to_stand_in_is_refused(monkeypatch):
    from sapp.capture import retry
    monkeypatch.setattr(retry, "MATERIALISE_MAX_BYTES", 1024)
    with torch.device("meta"):
        m = BranchOnValues()
    with pytest.raises(CaptureError) as e:
        capture(m, (torch.randint(0, 16, (B, S)),))
    msg = str(e.value)
    assert "\n" not in msg and "real parameters and example inputs (not meta)" in msg and "GiB" in msg


class MaskOnTheParameterDevice(torch.nn.Module):
    """Longformer / LED: the mask is built on the embeddings' device (meta for a meta model) from the
    inputs, then a branch reads it (`is_global_attn = mask.flatten().any().item()`)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, K)
        self.lin = torch.nn.Linear(K, K)

    def forward(self, ids):
        h = self.emb(ids)
        mask = (ids == 1).to(h.device)
        if mask.flatten().any().item():
            h = h + self.lin(h) * mask[:, :, None]
        return self.lin(h)


def test_a_mask_built_on_the_meta_device_takes_the_branch_its_inputs_take():
    with torch.device("meta"):
        m = MaskOnTheParameterDevice()
    glob = torch.randint(2, 16, (B, S))
    glob[1, 2] = 1
    assert sum(n.kind == "matmul" for n in capture(m, (glob,)).nodes.values()) == 2
    assert sum(n.kind == "matmul" for n in capture(m, (torch.randint(2, 16, (B, S)),)).nodes.values()) == 1


def test_as_strided_windows_keep_the_batch_splittable():
    W = 2                                             # Longformer's overlapping chunks

    class M(torch.nn.Module):
        def forward(self, x):
            x = x * 1
            n = S // W - 1
            return x.as_strided((B, n, 2 * W, K), (S * K, W * K, K, 1))
    g = capture(M(), (torch.randn(B, S, K),))
    assert not g.meta["unknown_ops"]
    a = next(n for n in g.nodes.values() if "as_strided" in n.target)
    assert a.kind == "view" and a.flops == 0 and a.bytes == 0
    assert a.operands[0].dims == ("a0", None, None) and [d.splittable for d in a.dims] == [True, False, False, False]
    assert a.dim("a0").batch
