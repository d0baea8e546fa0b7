"""What the "fused" runtime keeps for backward where Megatron-Core's kernels keep less than eager torch
(sapp/costmodel/fusion.py `fused_aliases`, `_routed_rows`): flash attention's output is the output
projection's input, GQA's k, v are kept at their kv heads, v keeps the whole q/k/v projection where
rotary embeddings made q and k new tensors, and an MoE's routing weights are applied inside the
SwiGLU.  Each is checked on one captured layer under "fused" and, unchanged, under "eager".
bench/megatron_saved_activations.py compares the whole layer with Megatron-Core's own (slow test)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from sapp.api import capture_graph
from sapp.cluster import PRESETS
from sapp.costmodel import CostSettings, saved_activations, saved_items
from sapp.cluster.mesh import Mesh
from sapp.models.gpt import GPT
from sapp.models.llama import Llama
from sapp.models.moe import MoEModel

B, S, H, HEADS, KV = 2, 16, 64, 8, 2
TOKENS = B * S


def _graph(model):
    with torch.device("meta"):
        m = model()
    g, _ = capture_graph(m, (torch.zeros(B, S, dtype=torch.long, device="meta"),))
    return g


def _settings(runtime):
    return CostSettings(precision="bf16-mixed", runtime=runtime)


def _items(g, name, runtime):
    mesh = Mesh.for_devices(PRESETS["cpu"], 1)
    saved_activations(g, {n: () for n in g.nodes}, mesh, _settings(runtime))      # stamps the marks
    return saved_items(g.nodes[name], (), mesh, _settings(runtime))


def _layer1(g, kind=None, module=None):
    return [n for n, nd in g.nodes.items() if (nd.module or "").startswith("layers.1")
            and (kind is None or nd.kind == kind) and (module is None or nd.module == module)]


def _layer_bytes(g, runtime):
    mesh = Mesh.for_devices(PRESETS["cpu"], 1)
    acts = saved_activations(g, {n: () for n in g.nodes}, mesh, _settings(runtime))
    block = set(_layer1(g))
    return sum(b for b, savers in acts.values() if savers[0] in block)


@pytest.fixture(scope="module")
def llama():
    return _graph(lambda: Llama(2, H, HEADS, KV, 128, S, 2 * H))


@pytest.fixture(scope="module")
def moe():
    return _graph(lambda: MoEModel(2, H, HEADS, KV, 128, S, 2 * H, experts=4, top_k=2, expert_ffn=2 * H))


def test_gqa_k_is_kept_at_its_kv_heads_and_v_as_the_whole_projection(llama):
    attn, = _layer1(llama, "attention")
    q = TOKENS * H * 2                                  # bf16
    kv = q * KV // HEADS
    eager = dict((i, b) for i, (_, b) in enumerate(_items(llama, attn, "eager")))
    fused = _items(llama, attn, "fused")
    assert [eager[i] for i in range(3)] == [q, q, q]    # k, v expanded to every query head
    assert [b for _, b in fused[:3]] == [q, kv, q + 2 * kv]
    assert fused[2][0] == f"{attn}:qkv"


def test_without_rotary_q_k_v_stay_views_of_one_projection():
    g = _graph(lambda: GPT(2, H, HEADS, 128, S, ffn=4 * H, dropout=0.0, attn="sdpa"))
    attn, = _layer1(g, "attention")
    fused = _items(g, attn, "fused")
    assert not any(tid.endswith(":qkv") for tid, _ in fused)
    assert [b for _, b in fused] == [TOKENS * H * 2] * 4     # q, k, v, output


def test_output_projection_input_is_the_attention_output(llama):
    attn, = _layer1(llama, "attention")
    wo, = _layer1(llama, module="layers.1.attn.wo")
    assert _items(llama, wo, "fused")[0][0] == attn
    assert _items(llama, wo, "eager")[0][0] != attn      # eager keeps its transposed copy


def test_routing_weights_keep_no_expert_outputs_under_fused(moe):
    mul = [n for n in _layer1(moe, "elementwise") if "mul" in moe.nodes[n].target
           and moe.nodes[n].operands[0].numel == TOKENS * 2 * H]
    assert len(mul) == 1
    rows = TOKENS * 2 * H * 2                            # top-2 rows of h, bf16
    assert max(b for _, b in _items(moe, mul[0], "eager")) == rows
    assert [b for _, b in _items(moe, mul[0], "fused")] == [TOKENS * 2 * 2]    # the top-2 weights only


def test_a_row_scale_of_a_kept_matmul_input_is_still_kept():
    """The scale moves into the producer only where that producer recomputes in backward (a SwiGLU);
    a linear read straight from the input keeps the scaled rows' source."""
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(128, H)
            self.lin = nn.Linear(H, H, bias=False)
            self.gate = nn.Linear(H, 1, bias=False)

        def forward(self, ids):
            x = self.emb(ids)
            return self.lin(x) * torch.sigmoid(self.gate(x))
    g = _graph(Scaled)
    mul = [n for n, nd in g.nodes.items() if nd.kind == "elementwise" and "mul" in nd.target]
    assert len(mul) == 1
    assert max(b for _, b in _items(g, mul[0], "fused")) == TOKENS * H * 2


@pytest.mark.parametrize("kind", ["llama", "moe"])
def test_fused_layer_is_smaller_and_eager_is_unchanged(kind, llama, moe):
    g = {"llama": llama, "moe": moe}[kind]
    fused, eager = _layer_bytes(g, "fused"), _layer_bytes(g, "eager")
    tok = TOKENS * H
    # fused: the transposed output copy (2 sbh) and the expanded k, v (2 x 1.5 sbh) go, v's whole
    # projection (3 sbh) comes; the MoE also drops its top-2 expert outputs (4 sbh)
    assert (eager - fused) / tok > (4.0 if kind == "moe" else 0.0)
    assert fused < eager


def test_under_cp_fused_trades_the_un_repeated_k_v_it_priced(llama):
    """A cp rank gives up its own k, v for the gathered ones: under "fused" those it gives up are the
    grouped (un-repeated) ones the profile priced, where eager priced the repeated copies."""
    from sapp.search.joint.cp import kv_saved_per_sample
    names = [n for n, nd in llama.nodes.items() if (nd.module or "").startswith("layers.1")]
    strat = {n: (None,) for n in llama.nodes}
    _items(llama, names[0], "fused")                    # stamps the marks
    per = {rt: kv_saved_per_sample(llama, names, strat, None, 1, _settings(rt)) for rt in ("eager", "fused")}
    exchanged, base_eager = per["eager"][0], per["eager"][1]
    assert base_eager == pytest.approx(exchanged * HEADS / KV)      # the repeated k, v
    assert per["fused"][1] == pytest.approx(exchanged)              # the grouped ones
