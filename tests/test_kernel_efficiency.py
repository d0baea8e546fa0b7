"""Compute efficiency by kernel (docs/ARCHITECTURE.md "Runtime profiles", "Compute efficiency by
kernel"): a fused attention kernel runs at its published figure, a dense GEMM on the summed roofline
(arithmetic + memory traffic, `Cluster.gemm_memory_overlap` = 0 on the GPU presets).  Expectations are
hand numbers: the FlashAttention-3 paper's cuDNN TFLOP/s over the H100's 989, and 2·M·N·K / rate +
2·(MK + KN + MN) / bandwidth for a bf16 GEMM."""
import dataclasses

import pytest
import torch
from torch import nn

from sapp.capture import capture
from sapp.cluster import PRESETS, Cluster
from sapp.costmodel import CostSettings, compute_time
from sapp.costmodel.dtypes import ensure_widths
from sapp.costmodel.nodes import node_cost
from sapp.costmodel.primitives import kernel_efficiency
from sapp.errors import ClusterError
from sapp.cluster.mesh import Mesh

H100 = PRESETS["h100-80g"]
FUSED = CostSettings(runtime="fused")


def test_hopper_presets_carry_the_published_attention_figures():
    # FlashAttention-3 paper (arXiv 2407.08608) Fig. 5 / 6, cuDNN, head dim 128, seq 4k, H100 SXM5
    for name in ("h100-80g", "h800", "h200"):
        cl = PRESETS[name]
        assert cl.attention_efficiency == pytest.approx(518 / 989)
        assert cl.attention_bwd_efficiency == pytest.approx(499 / 989)
        assert cl.gemm_memory_overlap == 0.0
    assert kernel_efficiency("attention", False, H100) == pytest.approx(0.5238, abs=1e-4)
    assert kernel_efficiency("attention", True, H100) == pytest.approx(0.5045, abs=1e-4)
    assert kernel_efficiency("matmul", False, H100) == 0.8
    # unset (0) falls back to compute_efficiency; the cpu preset keeps the plain roofline
    a100 = PRESETS["a100-80g"]
    assert kernel_efficiency("attention", True, a100) == a100.compute_efficiency
    assert PRESETS["cpu"].gemm_memory_overlap == 1.0
    assert all(PRESETS[n].gemm_memory_overlap == 0.0 for n in ("a100-80g", "v100-32g", "h100-80g", "h800", "h200"))



def test_each_torchtitan_release_prices_the_attention_kernel_it_runs():
    # torchtitan 0.3 as exported (attn_backend="varlen"): FlashAttention-3 on Hopper, the paper's 579 / 542
    # TFLOP/s; 0.2.2's SDPA: cuDNN's 518 / 499 (the cluster's figure); the Dec 2024 stack: SDPA's
    # FlashAttention-2, 319 / 310
    for runtime, fwd, bwd in (("torchtitan", 579, 542), ("torchtitan-0.2.2", 518, 499), ("fused", 518, 499),
                              ("torchtitan-2412", 319, 310)):
        st = CostSettings(runtime=runtime)
        assert kernel_efficiency("attention", False, H100, st) == pytest.approx(fwd / 989), runtime
        assert kernel_efficiency("attention", True, H100, st) == pytest.approx(bwd / 989), runtime
        assert kernel_efficiency("matmul", True, H100, st) == 0.8
    for name in ("h800", "h200"):
        assert PRESETS[name].flash_attention_efficiency == H100.flash_attention_efficiency
    # a cluster that names no FlashAttention figure prices its attention figure under every profile
    a100, own = PRESETS["a100-80g"], H100.replace(flash_attention_efficiency=0.0, flash_attention_bwd_efficiency=0.0)
    tt = CostSettings(runtime="torchtitan")
    assert kernel_efficiency("attention", True, a100, tt) == a100.compute_efficiency
    assert kernel_efficiency("attention", False, own, tt) == pytest.approx(518 / 989)
    with pytest.raises(ClusterError, match="flash_attention_efficiency"):
        Cluster.from_dict({**H100.to_dict(), "flash_attention_efficiency": 1.2})

def test_summed_roofline_by_hand():
    # 1 TFLOP at 989e12 * 0.8 and 1 GB at 3.35e12 * 0.8
    tc, tm = 1e12 / (989e12 * 0.8), 1e9 / (3.35e12 * 0.8)
    assert compute_time(1e12, 1e9, H100, overlap=1.0) == pytest.approx(max(tc, tm), rel=1e-12)
    assert compute_time(1e12, 1e9, H100, overlap=0.0) == pytest.approx(tc + tm, rel=1e-12)
    assert compute_time(1e12, 1e9, H100, overlap=0.25) == pytest.approx(tc + 0.75 * tm, rel=1e-12)
    assert compute_time(1e12, 0.0, H100, efficiency=0.5) == pytest.approx(1e12 / (989e12 * 0.5), rel=1e-12)


class Linear(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.w = nn.Parameter(torch.randn(k, n) * 0.01)

    def forward(self, x):
        return x @ self.w


def _gemm_node(m, k, n):
    with torch.device("meta"):          # shapes only: the 462B GEMM's real operands would take seconds to fill
        g = capture(Linear(k, n), (torch.empty(m, k),), batch=m)
    ensure_widths(g)
    return next(nd for nd in g.nodes.values() if nd.kind == "matmul")


@pytest.mark.parametrize("m,k,n", [(4096, 2048, 6144), (4096, 18432, 6912)])
def test_gemm_time_is_arithmetic_plus_traffic(m, k, n):
    """Megatron's 1.7B QKV GEMM (h=2048) and 462B's (h=18432, t=8) per micro-batch of 4096 tokens:
    bf16 operands and output, 2·(MK + KN + MN) bytes; the smaller GEMM's arithmetic intensity
    (1117 FLOP/B against 2257) leaves a larger share of its time to memory traffic."""
    node = _gemm_node(m, k, n)
    mesh = Mesh.for_devices(Cluster(gpus_per_node=1), 1)
    cl = dataclasses.replace(H100, op_overhead=0.0)
    c = node_cost(node, (None,) * len(mesh.levels), mesh, cl, FUSED)
    flops, nbytes = 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n)
    tc, tm = flops / (989e12 * 0.8), nbytes / (3.35e12 * 0.8)
    assert c.fwd_s == pytest.approx(tc + tm, rel=1e-9)
    assert c.bwd_s == pytest.approx(2 * (tc + tm), rel=1e-9)
    ai = flops / nbytes
    assert ai == pytest.approx(1117 if k == 2048 else 2257, rel=2e-3)
    # efficiency against the datasheet peak: 0.8 * AI / (AI + ridge), ridge = 989·0.8 / (3350·0.8)
    ridge = 989e12 / 3.35e12
    assert flops / c.fwd_s / 989e12 == pytest.approx(0.8 * ai / (ai + ridge), rel=1e-9)
    # the plain roofline of a calibrated machine (overlap 1): arithmetic only, this GEMM is compute-bound
    c1 = node_cost(node, (None,) * len(mesh.levels), mesh, dataclasses.replace(cl, gemm_memory_overlap=1.0), FUSED)
    assert c1.fwd_s == pytest.approx(tc, rel=1e-9)


def test_bad_efficiency_fields_are_one_line():
    for key, v in (("attention_efficiency", 1.5), ("attention_bwd_efficiency", -0.1), ("gemm_memory_overlap", 2)):
        with pytest.raises(ClusterError, match=key):
            H100.replace(**{key: v})
    cl = H100.replace(attention_efficiency=0.6)
    assert Cluster.from_dict(cl.to_dict()) == cl


class Causal(nn.Module):
    # a trainable scale on q: attention is differentiated only when a parameter feeds it (costmodel.grads)
    def __init__(self, d=128):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(d))

    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q * self.scale, k, v, is_causal=True)


def test_flash_attention_runs_at_the_published_rate():
    """b=2, 4 heads, s=256, head dim 128: forward = half the 4·b·a·s²·d score FLOPs at 518 TFLOP/s,
    backward 2.5x those FLOPs at 499 TFLOP/s (memory bandwidth out of the way)."""
    b, a, s, d = 2, 4, 256, 128
    x = [torch.randn(b, a, s, d) for _ in range(3)]
    g = capture(Causal(), tuple(x), batch=b)
    ensure_widths(g)
    node = next(nd for nd in g.nodes.values() if nd.kind == "attention")
    assert node.flops == 4.0 * b * a * s * s * d
    mesh = Mesh.for_devices(Cluster(gpus_per_node=1), 1)
    cl = dataclasses.replace(H100, op_overhead=0.0, mem_bandwidth=1e30)
    c = node_cost(node, (None,) * len(mesh.levels), mesh, cl, FUSED)
    assert c.fwd_s == pytest.approx(0.5 * node.flops / 518e12, rel=1e-9)
    assert c.bwd_s == pytest.approx(2.5 * 0.5 * node.flops / 499e12, rel=1e-9)


class LMHead(nn.Module):
    def __init__(self, h, v):
        super().__init__()
        self.out = nn.Linear(h, v, bias=False)

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.out(x), y)


def test_fused_runtime_prices_megatrons_fp32_cross_entropy():
    """Megatron-Core's vocab-parallel cross entropy casts the bf16 logits to fp32 and keeps the fp32
    softmax for backward (saves T·V·4 B), and runs its passes one kernel each: forward cast (2 + 4 B
    an element), max (4), subtract (8), exp (8), sum (4), divide (8); backward multiply (8) and the
    cast back to bf16 (6).  T=64 tokens, V=1000."""
    from sapp.costmodel.memory import saved_items
    T, V = 64, 1000
    g = capture(LMHead(32, V), (torch.randn(T, 32), torch.randint(0, V, (T,))), batch=T)
    ensure_widths(g)
    loss = next(nd for nd in g.nodes.values() if nd.kind == "loss")
    mesh = Mesh.for_devices(Cluster(gpus_per_node=1), 1)
    st = (None,) * len(mesh.levels)
    cl = dataclasses.replace(H100, op_overhead=0.0)
    c = node_cost(loss, st, mesh, cl, FUSED)
    fwd_bytes = T * V * (6 + 4 + 8 + 8 + 4 + 8) + T * 8            # the six passes; the target ids
    assert c.fwd_s == pytest.approx(fwd_bytes / (3.35e12 * 0.8), rel=1e-9)
    assert c.bwd_s == pytest.approx(T * V * (8 + 6) / (3.35e12 * 0.8), rel=1e-9)
    # eager autocast's cross entropy is priced from the captured op (one cast copy, 2x for backward)
    e = node_cost(loss, st, mesh, cl, CostSettings())
    assert e.fwd_s < c.fwd_s and e.bwd_s == pytest.approx(2 * e.fwd_s, rel=1e-9)
    saved = dict(saved_items(loss, st, mesh, FUSED))
    assert sum(saved.values()) == pytest.approx(T * V * 4 + T * 8)
    # eager autocast prices the same cast (CUDA's autocast runs the loss in fp32 too)
    eager = dict(saved_items(loss, st, mesh, CostSettings()))
    assert sum(eager.values()) == pytest.approx(T * V * 4 + T * 8)
