"""Fused attention (SDPA) and the runtime profiles: the zoo's attention kinds train alike and mask
causally, SDPA is captured and priced as the fused kernel (no s² tensor saved, 2.5x backward, half the
score FLOPs when causal), and the "fused" runtime elides the intermediates of point-wise chains.
Captures of tiny models and pure cost functions: a few seconds."""
import dataclasses

import pytest
import torch
from torch import nn

import sapp.models as zoo
from sapp.api import capture_graph
from sapp.capture import capture
from sapp.cluster import PRESETS
from sapp.costmodel import CostSettings, node_cost, saved_activations
from sapp.costmodel.dtypes import ensure_widths, fusion_of
from sapp.costmodel.nodes import local_bytes
from sapp.errors import SappError
from sapp.cluster.mesh import Level, Mesh

MESH1 = Mesh((Level(1, "intra"),))
EAGER = CostSettings()
FUSED = CostSettings(runtime="fused")


def _grads(m, ids):
    loss = m(ids).float().pow(2).mean()
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in m.named_parameters()}


def test_sdpa_and_eager_gpt_train_alike():
    torch.manual_seed(0)
    a = zoo.get("gpt-tiny", device="cpu", dropout=0.0)
    b = zoo.get("gpt-tiny", device="cpu", dropout=0.0, attn="sdpa")
    b.load_state_dict(a.state_dict())
    ids = zoo.example_inputs(a, 3)[0]
    la, ga = _grads(a, ids)
    lb, gb = _grads(b, ids)
    assert abs(la - lb) <= 1e-5 * abs(la)
    for n in ga:
        assert torch.allclose(ga[n], gb[n], rtol=1e-4, atol=1e-6), n


@pytest.mark.parametrize("name,cfg", [("gpt-tiny", {"attn": "eager"}), ("gpt-tiny", {"attn": "sdpa"}),
                                      ("llama-tiny", {})])
def test_attention_is_causal(name, cfg):
    """Changing token j changes no logit before position j (and does change position j's)."""
    torch.manual_seed(0)
    kw = dict(cfg, dropout=0.0) if name.startswith("gpt") else cfg
    m = zoo.get(name, device="cpu", **kw).eval()
    ids = zoo.example_inputs(m, 2)[0]
    j = ids.shape[1] // 2
    ids2 = ids.clone()
    ids2[:, j] = (ids2[:, j] + 1) % 256
    with torch.no_grad():
        y1, y2 = m(ids), m(ids2)
    assert torch.equal(y1[:, :j], y2[:, :j])
    assert not torch.allclose(y1[:, j], y2[:, j])


def test_bad_attention_kind_is_one_line():
    with pytest.raises(SappError, match="attn="):
        zoo.get("gpt-tiny", attn="flash")


@pytest.fixture(scope="module")
def graphs():
    out = {}
    for s in (32, 64):
        for attn in ("eager", "sdpa"):
            out[(attn, s)] = capture_graph(zoo.get("gpt-tiny", attn=attn, s=s))[0]
    return out


def _attention(g):
    return next(n for n in g.nodes.values() if n.kind == "attention")


def test_sdpa_saves_q_k_v_and_output_only(graphs):
    g = graphs[("sdpa", 32)]
    node = _attention(g)
    assert node.saves == ("in0", "in1", "in2", "out")
    assert node.extra["causal"] is True
    # no saved tensor anywhere in the sdpa model grows with s²: twice the sequence, twice the bytes
    # (the eager model's scores, softmax and dropout mask make its activations grow faster)
    def acts(key):
        gr = graphs[key]
        strat = {n: (None,) for n in gr.nodes}
        return sum(b for b, _ in saved_activations(gr, strat, MESH1, FUSED).values())
    assert acts(("sdpa", 64)) / acts(("sdpa", 32)) == pytest.approx(2.0, rel=0.01)
    assert acts(("eager", 64)) / acts(("eager", 32)) > 2.3


def test_sdpa_priced_as_flash_kernel(graphs):
    """Compute-bound cluster (huge memory bandwidth): forward = half the score FLOPs (causal),
    backward = 2.5x the forward (q·kᵀ recomputed + four gradient GEMMs)."""
    g = graphs[("sdpa", 32)]
    node = _attention(g)
    b, a, s, hd = 8, 4, 32, 16                      # capture batch 8, gpt-tiny: a=4, h=64
    assert node.flops == 4.0 * b * a * s * s * hd   # q·kᵀ and ·v, 2 FLOPs per multiply-add
    cl = dataclasses.replace(PRESETS["a100-80g"], mem_bandwidth=1e30, op_overhead=0.0)
    c = node_cost(node, (None,), MESH1, cl, EAGER)
    rate = cl.peak_flops * cl.compute_efficiency
    assert c.fwd_s == pytest.approx(0.5 * node.flops / rate, rel=1e-9)
    assert c.bwd_s == pytest.approx(2.5 * c.fwd_s, rel=1e-9)


class Chain(nn.Module):
    """x*2 + 1 -> softmax: a point-wise chain with a softmax epilogue (Megatron's scale-mask-softmax)."""

    def forward(self, x):
        return torch.softmax(x * 2.0 + 1.0, dim=-1)


def test_fused_runtime_elides_chain_intermediates():
    g = capture(Chain(), (torch.randn(4, 64, 128),), batch=4)
    ensure_widths(g)
    mul, add, sm = (next(n for n in g.nodes.values() if n.target.startswith(t))
                    for t in ("aten.mul", "aten.add", "aten.softmax"))
    assert fusion_of(mul) == ((), True, ()) and fusion_of(add) == ((0,), True, ()) and fusion_of(sm) == ((0,), False, ())
    numel, f = 4 * 64 * 128, {}
    st = CostSettings(runtime="fused")
    # hand count at 2 B per float (bf16 activations): the chain reads x once and writes the softmax once
    assert local_bytes(mul, f, st) == pytest.approx(numel * 2)
    assert local_bytes(add, f, st) == 0.0
    assert local_bytes(sm, f, st) == pytest.approx(numel * 2)
    eager = sum(local_bytes(n, f, CostSettings(runtime="eager", autocast_fp32=False)) for n in (mul, add, sm))
    assert eager == pytest.approx(numel * 2 * 6)        # three ops, each reads and writes once
    # and a fused-away node launches no kernel of its own
    cl = dataclasses.replace(PRESETS["a100-80g"], op_overhead=1.0)
    assert node_cost(add, (None,), MESH1, cl, st).fwd_s < 1e-6        # its FLOPs only: no 1 s launch
    assert node_cost(add, (None,), MESH1, cl, EAGER).fwd_s >= 1.0


class SwiGLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(64, 96, bias=False), nn.Linear(64, 96, bias=False), nn.Linear(96, 64)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def test_fused_swiglu_keeps_its_input_not_silu():
    """Megatron-Core's bias-SwiGLU kernel saves [gate | up] and recomputes silu in backward: under "fused"
    silu(gate) is neither written nor kept (eager keeps it for up's gradient)."""
    from sapp.costmodel import saved_activations
    from sapp.cluster.mesh import Mesh
    g = capture(SwiGLU(), (torch.randn(4, 16, 64),), batch=4)
    silu = next(n for n in g.nodes.values() if n.target.startswith("aten.silu"))
    mul = next(n for n in g.nodes.values() if n.target.startswith("aten.mul"))
    ensure_widths(g)
    i = next(i for i, o in enumerate(mul.operands) if o.producer == silu.name)
    assert fusion_of(silu)[1] and fusion_of(mul)[0] == (i,) and fusion_of(mul)[2] == (i,)
    mesh = Mesh.for_devices(PRESETS["cpu"], 1)
    strat = {n: () for n in g.nodes}
    row = 4 * 16 * 96 * 2                             # one bf16 (b, s, 96) tensor
    kept = {st: sum(b for b, _ in saved_activations(g, strat, mesh, CostSettings(runtime=st, autocast_fp32=False)).values())
            for st in ("eager", "fused")}
    assert kept["eager"] - kept["fused"] == row       # silu(gate): gate, up and the product are kept by both
    assert silu.name in saved_activations(g, strat, mesh, CostSettings(runtime="eager", autocast_fp32=False))
    assert silu.name not in saved_activations(g, strat, mesh, CostSettings(runtime="fused"))


def test_fused_gpt_layer_fuses_megatrons_chains(graphs):
    """On the eager GPT: scale -> mask -> softmax and dropout -> residual add are fused chains; a tensor
    kept for backward (the GeLU input, the softmax output) is never fused away."""
    g = graphs[("eager", 32)]
    ensure_widths(g)
    blk = [g.nodes[n] for n in g.blocks["layers.0"]]
    by = {}
    for n in blk:
        by.setdefault(n.target.split(".")[1], []).append(n)
    assert fusion_of(by["masked_fill"][0])[1] and fusion_of(by["mul"][0])[1]
    assert fusion_of(by["_softmax"][0] if "_softmax" in by else by["softmax"][0])[0] == (0,)
    assert all(fusion_of(d)[1] for d in by["dropout"][1:])          # resid dropouts feed the residual adds
    assert not fusion_of(by["dropout"][0])[1]                          # attention dropout feeds a matmul
    assert not any(fusion_of(n)[1] for n in blk if n.kind in ("matmul", "norm", "softmax"))


def test_runtime_setting():
    assert not FUSED.autocast and EAGER.autocast
    with pytest.raises(SappError, match="runtime"):
        CostSettings(runtime="megatron")


def test_fused_runtime_is_cheaper_and_eager_unchanged(graphs):
    from sapp.costmodel import evaluate_sharding
    g = graphs[("eager", 32)]
    strat = {n: (None,) for n in g.nodes}
    cl = dataclasses.replace(PRESETS["h100-80g"], op_overhead=0.0)     # tiny ops: bytes, not launches
    def compute(settings, kinds=lambda k: k != "loss"):
        per = evaluate_sharding(g, strat, MESH1, cl, settings).per_node
        return sum(per[n]["fwd_s"] + per[n]["bwd_s"] for n in g.nodes if kinds(g.nodes[n].kind))
    e, e2 = compute(EAGER), compute(CostSettings(autocast_fp32=True, runtime="eager"))
    fu, mg = compute(FUSED), compute(CostSettings(autocast_fp32=False))
    # fusion makes the model's ops cheaper than the same bf16 widths unfused ...
    assert e == e2 and fu < mg < e
    # ... while the loss costs more: Megatron's cross entropy runs its fp32 passes one kernel each
    is_loss = lambda k: k == "loss"  # noqa: E731
    assert compute(FUSED, is_loss) > compute(CostSettings(autocast_fp32=False), is_loss)
