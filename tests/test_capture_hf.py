"""Capture knows what it does not know: the 8 tiny HF models capture with no unknown op; RMSNorm is one
norm node; T5 captures; new op families carry hand-counted FLOPs; an op sapp has no rule for is named
in the plan's notes and in `sapp explain` with its share of the FLOPs."""
import collections
import time

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

import sapp  # noqa: E402
from sapp.api import search  # noqa: E402
from sapp.capture import capture  # noqa: E402
from tests.hf_tiny import BATCH, SEQ, build, configs  # noqa: E402

MODELS = list(configs())


@pytest.mark.parametrize("name", MODELS)
def test_no_unknown_ops(name):
    m, inputs, cfg = build(name)
    t0 = time.perf_counter()
    g = capture(m, inputs)
    unknown = [n.target for n in g.nodes.values() if n.extra.get("generic")]
    print(f"{name}: {len(g.nodes)} nodes, {len(unknown)} unknown ops, captured in {time.perf_counter() - t0:.2f} s")
    assert unknown == [] and g.meta["unknown_ops"] == []
    # every linear layer is priced as a GEMM, 2 FLOPs per multiply-add, over the rows it sees: each
    # token (T5's encoder and decoder both see SEQ here; ViT's 16 patches + CLS), ViT's head the CLS rows
    tokens = BATCH * (SEQ if name != "vit" else (32 // 8) ** 2 + 1)
    want = sum(2.0 * (BATCH if q == "classifier" else tokens) * mod.in_features * mod.out_features
               for q, mod in m.named_modules() if isinstance(mod, nn.Linear) and ".experts" not in q)
    if name == "mixtral":                  # the router is a bare weight (F.linear), not an nn.Linear
        want += cfg.num_hidden_layers * 2.0 * tokens * cfg.hidden_size * cfg.num_local_experts
    got = sum(n.flops for n in g.nodes.values() if n.target == "aten.linear.default")
    assert got == pytest.approx(want)


def test_rms_norm_is_one_norm_node_over_the_last_axis():
    m, inputs, cfg = build("llama")
    g = capture(m, inputs)
    norms = [n for n in g.nodes.values() if n.kind == "norm"]
    assert len(norms) == 2 * cfg.num_hidden_layers + 1          # input + post-attention per layer, final
    for n in norms:
        assert n.target == "aten.rms_norm.default"
        assert not n.dims[-1].splittable and n.dims[0].splittable and n.dims[0].batch
        assert n.flops == 4.0 * BATCH * SEQ * cfg.hidden_size
        assert sorted(n.params)[0].endswith("layernorm.weight") or sorted(n.params)[0] == "model.norm.weight"
    assert not any(n.target.startswith("aten.rsqrt") for n in g.nodes.values())
    # rotary cos/sin come from the model's rotary_emb (its no-grad region is inlined, not opaque)
    assert any(n.module == "model.rotary_emb" and n.target == "aten.cos.default" for n in g.nodes.values())


def test_t5_encoder_decoder_captures():
    m, inputs, cfg = build("t5")
    g = capture(m, inputs)
    att = [n for n in g.nodes.values() if n.kind == "matmul" and n.module.endswith((".q", ".k", ".v", ".o"))]
    # encoder self-attention, decoder self- and cross-attention: 4 projections each, per layer
    assert len(att) == 4 * (cfg.num_layers + 2 * cfg.num_decoder_layers)
    assert sum(1 for n in g.nodes.values() if n.target == "aten.rms_norm.default") == 2 * cfg.num_layers + \
        3 * cfg.num_decoder_layers + 2


class _Ops(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.gru = nn.GRU(32, 24, batch_first=True, bidirectional=True)
        self.bag = nn.EmbeddingBag(100, 16, mode="sum")
        self.up = nn.ConvTranspose2d(4, 8, 3, stride=2)

    def forward(self, x, ids, img):
        y, _ = self.lstm(x)
        z, _ = self.gru(y)
        w = torch.where(z > 0, z, torch.maximum(z, 2 * z)).minimum(z)
        top = torch.topk(w, 3, dim=-1).indices
        g = torch.gather(w, 2, top)
        return z.sum() + g.sum() + self.bag(ids).sum() + self.up(img).sum()


def test_recurrent_conv_transpose_bag_and_binary_ops_are_known():
    B, T, I = 4, 5, 16
    m = _Ops()
    x, ids, img = torch.randn(B, T, I), torch.randint(0, 100, (B, 3)), torch.randn(B, 4, 8, 8)
    g = capture(m, (x, ids, img))
    assert g.meta["unknown_ops"] == []
    by = {n.target.split(".")[1]: n for n in g.nodes.values() if n.target.startswith("aten.")}
    # LSTM: 4 gates x 2·H·(I + H) per token and layer; GRU: 3 gates, two directions
    H = 32
    assert by["lstm"].flops == B * T * 2 * 4 * H * ((I + H) + (H + H))
    assert by["gru"].flops == B * T * 2 * 2 * 3 * 24 * (32 + 24)
    assert [d.name for d in by["lstm"].dims if d.splittable] == ["b0"]
    # conv_transpose: the same count torch's own flop counter gives
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as fc:
        m.up(img)
    assert by["conv_transpose2d"].flops == fc.get_total_flops()
    assert by["embedding_bag"].kind == "embedding" and by["embedding_bag"].flops == B * 3 * 16
    assert by["maximum"].kind == "elementwise" and by["minimum"].kind == "elementwise"
    assert by["topk"].dims[-1].splittable is False


def test_unknown_op_is_named_with_its_share_in_plan_and_explain():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16, bias=False)

        def forward(self, x):
            return torch.logcumsumexp(self.fc(x), dim=1)

    B = 8
    plan = search(Odd(), "cpu:gpus=1", global_batch=B, example_inputs=(torch.randn(B, 16),))
    # hand count: the linear 2·B·16·16 FLOPs, the unknown op 1 per output element (B·16)
    share = (B * 16) / (2 * B * 16 * 16 + B * 16)
    rows = plan.model["meta"]["unknown_ops"]
    assert [r["op"] for r in rows] == ["aten.logcumsumexp.default"]
    assert rows[0]["flops_share"] == pytest.approx(share, rel=1e-4)
    note = next(n for n in plan.notes if n.startswith("unknown ops"))
    assert "aten.logcumsumexp.default x1" in note and f"{100 * share:.3g}% of FLOPs" in note
    from sapp.report.explain import explain
    text = explain(plan)
    assert "aten.logcumsumexp.default" in text and f"{100 * share:8.4f}% of FLOPs" in text


def test_index_routing_ops_split_with_the_batch():
    class Route(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):                      # x [B, 8]: each row picks its own 2 best features
            idx = torch.sort(self.fc(x), dim=0).indices[:, 0]
            return x[idx] * torch.gather(x, 1, torch.topk(x, 2, dim=1).indices).sum(1, keepdim=True)

    g = capture(Route(), (torch.randn(8, 8),))
    kinds = collections.Counter(n.target.split(".")[1] for n in g.nodes.values() if n.target.startswith("aten."))
    assert {"sort", "index", "gather", "topk"} <= set(kinds) and g.meta["unknown_ops"] == []
    index = next(n for n in g.nodes.values() if n.target.startswith("aten.index."))
    assert index.dims[0].batch and index.dims[0].splittable     # rows picked per data shard


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral"])
def test_sdpa_decoder_is_captured_as_its_training_step_runs(name):
    """Eager training with no padding mask: transformers builds no mask (SDPA's is_causal) and hands
    the kernel un-repeated grouped-query K/V.  Under torch.export it would materialise a (b, 1, s, s)
    mask and repeat K/V; the capture (sapp.models.hf.eager_masks) traces the training semantics, and
    leaves transformers as it found it."""
    import transformers.masking_utils as mu
    before = (mu._ignore_causal_mask_sdpa, mu.find_packed_sequence_indices)
    cfg, cls, _ = configs()[name]
    cfg._attn_implementation = "sdpa"
    S = 24                                   # != the head dim (16): an s x s tensor is recognisable
    with torch.device("meta"):
        m = cls(cfg)
    g = capture(m, (torch.empty(BATCH, S, dtype=torch.long, device="meta"),))
    assert (mu._ignore_causal_mask_sdpa, mu.find_packed_sequence_indices) == before
    attn = [n for n in g.nodes.values() if n.kind == "attention"]
    assert len(attn) == cfg.num_hidden_layers
    kv, heads, hd = cfg.num_key_value_heads, cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    for n in attn:
        assert n.extra["causal"] and len(n.operands) == 3                  # no mask operand
        assert n.operands[1].numel == n.operands[2].numel == BATCH * kv * S * hd      # un-repeated
        assert n.operands[0].numel == BATCH * heads * S * hd
        # a tensor-parallel split of the heads must keep whole KV heads: the head dim has kv's size,
        # and q, k, v and the output all shard along it
        dims = {d.name: d for d in n.dims}
        assert dims["b1"].size == kv and all(o.dims[1] == "b1" for o in n.operands) and n.out.dims[1] == "b1"
    # no tensor of s x s anywhere (the mask, or scores outside the kernel)
    assert not [n.name for n in g.nodes.values() if tuple(n.out.shape[-2:]) == (S, S)]


def test_hf_decoder_attention_is_captured_as_eager_runs_it():
    """Called with input ids alone, an HF decoder's eager forward skips the causal mask (no padding, no
    packed sequences) and runs SDPA with is_causal=True on the key/value heads as they are (enable_gqa);
    torch.export refuses both shortcuts, so a plain capture saw a materialised s x s mask, a non-causal
    attention over the whole s^2 and repeat_kv's copies of k and v.  Capture now sees what eager runs
    (sapp.models.hf.eager_masks): priced at the causal kernel's half of the score FLOPs, k and v saved at
    the key/value heads' size, and still split with their query heads under tensor parallelism."""
    from sapp.cluster import Cluster
    from sapp.costmodel import CostSettings, node_cost
    from sapp.costmodel.memory import saved_items
    from sapp.costmodel.nodes import time_flops
    from sapp.cluster.mesh import Level, Mesh
    import transformers.masking_utils as mu
    m, inputs, cfg = build("llama")                       # 4 heads, 2 key/value heads
    guards = (mu.is_torchdynamo_exporting, mu.find_packed_sequence_indices)
    g = capture(m, inputs)
    assert (mu.is_torchdynamo_exporting, mu.find_packed_sequence_indices) == guards      # restored
    att = [n for n in g.nodes.values() if n.kind == "attention"]
    assert len(att) == cfg.num_hidden_layers
    a = att[0]
    assert a.extra["causal"] and a.extra["gqa"]
    assert not any(n.out.dtype == "bool" for n in g.nodes.values())                     # no mask built
    q, k, v = a.operands
    hd = cfg.hidden_size // cfg.num_attention_heads
    assert q.shape == (BATCH, 4, SEQ, hd) and k.shape == v.shape == (BATCH, 2, SEQ, hd)
    assert q.dims[1] == k.dims[1] == v.dims[1] == "b1"      # the kv heads split with their query heads
    # model FLOPs still count the whole s^2 (q.k^T and .v over every query head)
    assert a.flops == 2.0 * BATCH * 4 * SEQ * SEQ * 2 * hd
    cl, st = Cluster.parse("h100-80g:devices=2"), CostSettings(runtime="fused")
    mesh = Mesh((Level(2, "intra"),))
    saved = dict(saved_items(a, ("b1",), mesh, st))
    assert saved[k.producer] == pytest.approx(saved[q.producer] / 2)   # 1 of 2 kv heads, 2 of 4 q heads
    # the causal kernel executes half the score FLOPs (costmodel.nodes.time_flops)
    assert time_flops(a, a.flops)[0] == pytest.approx(a.flops / 2)
    assert node_cost(a, ("b1",), mesh, cl, st).fwd_s > 0
    # with an attention mask among the inputs the model decides for itself: the mask stays
    ids = inputs[0]
    g2 = capture(m, (ids, torch.ones(ids.shape, dtype=torch.long, device="meta")))
    a2 = next(n for n in g2.nodes.values() if n.kind == "attention")
    assert not a2.extra["causal"] and len(a2.operands) == 4
