"""The capture accelerator (two blocks captured, replicated to full depth) must give exactly the
graph a direct capture gives; and third-party (Hugging Face) models capture with blocks."""
import pytest
import torch

import sapp.models as M
from sapp.capture import capture


def _assert_same(a, b):
    assert list(a.nodes) == list(b.nodes)
    for name in a.nodes:
        assert a.nodes[name] == b.nodes[name], name
    assert a.params == b.params and list(a.params) == list(b.params)
    assert a.blocks == b.blocks and a.block_groups == b.block_groups
    assert a.outputs == b.outputs and a.fingerprint() == b.fingerprint()
    assert a.total_flops() == b.total_flops()


@pytest.mark.parametrize("layers", [4, 6])
def test_replicated_gpt_equals_direct_capture(layers):
    model = M.get("gpt-small", dropout=0.1, l=layers)
    direct = capture(model, batch=2, fast=False)
    fast = capture(model, batch=2, fast=True)
    assert direct.meta.pop("capture") == "export" and fast.meta.pop("capture") == "export+replicate"
    _assert_same(direct, fast)
    assert direct.meta == fast.meta
    assert len(model.layers) == layers                # the model is restored after truncation


def test_replicated_mlp_equals_direct_capture():
    model = M.get("mlp-tiny", dims=(16, 32, 32, 32, 32), act="gelu")
    # layers.0 differs from the others (16 -> 32), so the stack is not uniform: no replication
    g = capture(model, batch=3, fast=True)
    assert g.meta["capture"] == "export"
    model = M.get("mlp-tiny", dims=(32, 32, 32, 32, 32), act="gelu")
    _assert_same(capture(model, batch=3, fast=False), capture(model, batch=3, fast=True))


class _SkipLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, h, h0):
        return torch.relu(self.fc(h)) + h0


class _SkipNet(torch.nn.Module):
    """Every layer also reads the FIRST layer's output: replication must keep that link to layer 0
    rather than re-pointing it at the previous layer."""

    def __init__(self, n):
        super().__init__()
        self.layers = torch.nn.ModuleList(_SkipLayer() for _ in range(n))

    def forward(self, x):
        h0 = h = self.layers[0](x, x)
        for layer in self.layers[1:]:
            h = layer(h, h0)
        return h


def test_replication_keeps_links_to_early_blocks():
    model = _SkipNet(6)
    x = torch.randn(4, 8)
    direct, fast = capture(model, (x,), fast=False), capture(model, (x,), fast=True)
    assert fast.meta["capture"] == "export+replicate"
    direct.meta.pop("capture"), fast.meta.pop("capture")
    _assert_same(direct, fast)
    h0 = direct.blocks["layers.0"][-1]
    assert all(h0 in direct.nodes[direct.blocks[f"layers.{k}"][-1]].producers for k in range(1, 6))


def test_gpt3_175b_captures_fast_on_meta():
    import time
    model = M.get("gpt3-175b")
    t = time.perf_counter()
    g = capture(model, batch=1)
    took = time.perf_counter() - t
    assert g.meta["capture"] == "export+replicate"
    assert len(g.blocks) == 96 and g.block_groups == [[f"layers.{i}" for i in range(96)]]
    assert g.param_count() == M.info("gpt3-175b")["params"]
    assert all(p.is_meta for p in model.parameters())
    assert took < 30       # ~1 s on an idle core; generous for a loaded CI box
    # the last block's output feeds the final norm
    ln_f = next(n for n in g if n.module == "ln_f")
    assert g.nodes[ln_f.producers[0]].block == "layers.95"


transformers = pytest.importorskip("transformers")


def _hf_gpt2(n_layer):
    cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=64, n_head=4, vocab_size=256, n_positions=32,
                                  use_cache=False)
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(cfg)


def test_hf_gpt2_captures_with_blocks_and_replicates():
    model = _hf_gpt2(5)
    ids = torch.randint(0, 256, (2, 32))

    def lm_loss(out, target):
        return torch.nn.functional.cross_entropy(out.flatten(0, 1), target.flatten())
    direct = capture(model, (ids,), target=ids, loss_fn=lm_loss, fast=False)
    assert list(direct.blocks) == [f"transformer.h.{i}" for i in range(5)]
    assert direct.block_groups == [list(direct.blocks)]
    assert direct.nodes[direct.outputs[0]].kind == "loss"
    assert sum(n.kind == "attention" for n in direct) == 5
    assert sum(n.kind == "matmul" for n in direct) == 5 * 4 + 1
    # tied wte/lm_head: one parameter, counted once
    assert direct.param_count() == sum(p.numel() for p in model.parameters())
    assert direct.meta["tied"] == {"transformer.wte.weight": "lm_head.weight"}
    fast = capture(model, (ids,), target=ids, loss_fn=lm_loss, fast=True)
    assert fast.meta["capture"] == "export+replicate"
    _assert_same(direct, fast)
    addmm = next(n for n in direct if n.target == "aten.addmm.default")
    assert [d.name for d in addmm.dims] == ["b0", "n", "k"] and addmm.dim("b0").batch


def test_hf_bert_captures():
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=256, max_position_embeddings=64)
    ids = torch.randint(0, 256, (2, 16))
    for cls, prefix in ((transformers.BertForMaskedLM, "bert."), (transformers.BertModel, "")):
        with torch.device("meta"):
            model = cls(cfg)
        g = capture(model, (ids,))
        assert list(g.blocks) == [f"{prefix}encoder.layer.{i}" for i in range(2)]
        assert g.block_groups == [list(g.blocks)]
        assert g.param_count() == sum(p.numel() for p in model.parameters())
        assert all(n.dims[0].batch for n in g if n.kind in ("matmul", "attention"))


@pytest.mark.parametrize("dense", [1, 2])
def test_replicated_moe_after_dense_blocks_equals_direct_capture(dense):
    # DeepSeek-V3's shape: the first `dense` blocks differ from the MoE blocks after them; only the
    # run of identical blocks at the end is replicated, the dense ones stay as captured
    model = M.get("moe-tiny", l=dense + 4, dense=dense)
    direct = capture(model, batch=2, fast=False)
    fast = capture(model, batch=2, fast=True)
    assert direct.meta.pop("capture") == "export" and fast.meta.pop("capture") == "export+replicate"
    _assert_same(direct, fast)
    assert direct.meta == fast.meta
    assert len(direct.block_groups) == 2 and len(direct.block_groups[0]) == dense
    assert len(model.layers) == dense + 4
