"""The model zoo: parameter counts against the REFERENCE formulas, meta builds, inputs, errors."""
import pytest
import torch

import sapp.models as M
from sapp.errors import SappError

GPT_NAMES = [n for n in M.names() if M.info(n)["kind"] == "gpt"]


def reference_psi(l, h, V, s, **_):
    # REFERENCE: Psi = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h))
    return 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


@pytest.mark.parametrize("name", GPT_NAMES)
def test_gpt_param_count_matches_reference(name):
    cfg = M.info(name)["config"]
    model = M.get(name)
    n = sum(p.numel() for p in model.parameters())
    # Our architecture = the formula's (blocks + tok/pos embeddings) + final LN (2h) + untied head (Vh).
    extra = 2 * cfg["h"] + cfg["V"] * cfg["h"]
    assert n - extra == round(reference_psi(**cfg))
    assert n == M.info(name)["params"]


def test_tied_embeddings_reach_formula_plus_final_ln():
    m = M.get("gpt-small", tie_embeddings=True)
    cfg = m.sapp_spec.config
    assert sum(p.numel() for p in m.parameters()) == round(reference_psi(**cfg)) + 2 * cfg["h"]
    assert m.head.weight is m.embed.tok.weight


def test_gpt3_175b_on_meta_allocates_nothing():
    m = M.get("gpt3-175b")
    assert all(p.is_meta for p in m.parameters())
    assert 1.74e11 < M.info("gpt3-175b")["params"] < 1.76e11
    assert len(m.layers) == 96 and m.layers[0].attn.qkv.weight.shape == (3 * 12288, 12288)


def test_known_sizes():
    assert abs(M.info("resnet50")["params"] - 25_557_032) == 0     # torchvision's ResNet-50 count
    assert 9.9e9 < M.info("gpt-10b")["params"] < 1.03e10
    assert 1.3e9 < M.info("gpt3-1.3b")["params"] < 1.5e9


def test_module_names_are_the_contract():
    m = M.get("gpt-tiny")
    names = dict(m.named_modules())
    for q in ["embed.tok", "embed.pos", "layers.0.ln1", "layers.0.attn.qkv", "layers.0.attn.proj",
              "layers.1.ln2", "layers.1.mlp.fc1", "layers.1.mlp.fc2", "ln_f", "head"]:
        assert q in names, q
    assert isinstance(m.layers, torch.nn.ModuleList)
    r = M.get("resnet50")
    assert [len(getattr(r, f"layer{i}")) for i in range(1, 5)] == [3, 4, 6, 3]


@pytest.mark.parametrize("name", ["gpt-tiny", "bert-tiny", "resnet-tiny", "wide-deep-tiny", "mlp-tiny"])
def test_forward_loss_backward_on_cpu(name):
    torch.manual_seed(0)
    m = M.get(name, device="cpu")
    x, y = M.example_inputs(m, 4), M.example_targets(m, 4)
    loss = M.WithLoss(m)(*x, target=y)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in m.parameters())
    out = m(*x)
    assert out.shape[0] == 4
    # Deterministic init under a fixed seed.
    torch.manual_seed(0)
    m2 = M.get(name, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), m2.parameters()))


def test_example_input_shapes_and_ranges():
    m = M.get("gpt-small", device="cpu")
    (ids,) = M.example_inputs(m, 3)
    assert ids.shape == (3, 64) and ids.dtype == torch.long and 0 <= int(ids.min()) and int(ids.max()) < 512
    assert M.example_targets(m, 3).shape == (3, 64)
    (ids,) = M.example_inputs(M.get("gpt3-175b"), 2)
    assert ids.is_meta and ids.shape == (2, 2048)
    wd = M.get("wide-deep-tiny", device="cpu")
    dense, cat = M.example_inputs(wd, 5)
    assert dense.shape == (5, 13) and cat.shape == (5, 26) and int(cat.max()) < 100
    assert M.example_targets(wd, 5).dtype == torch.float32
    assert M.example_inputs(M.get("resnet50"), 2)[0].shape == (2, 3, 224, 224)


def test_wide_deep_tables():
    m = M.get("wide-deep")
    assert m.deep_emb.weight.shape == (26 * 1_000_000, 80) and m.wide_emb.weight.shape == (26_000_000, 1)
    assert m.deep_emb.sparse and m.wide_emb.sparse
    big = M.info("wide-deep-100m")["config"]
    assert big["vocab"] >= 100_000_000 and big["rows_per_field"] == -(-100_000_000 // 26)
    small = M.get("wide-deep", vocab=1_000_000, sparse=False)
    assert small.deep_emb.weight.shape[0] == 26 * 38462 and not small.deep_emb.sparse
    assert [m.deep[i].out_features for i in (0, 2, 4, 6)] == [1024, 512, 256, 1]


def test_errors_are_one_line_and_list_choices():
    with pytest.raises(SappError) as e:
        M.get("gpt-huge")
    assert "gpt3-175b" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SappError) as e:
        M.get("gpt-tiny", layers=3)
    assert "valid keys" in str(e.value) and "'l'" not in str(e.value) and " l," in str(e.value)
    with pytest.raises(SappError):
        M.example_inputs(torch.nn.Linear(2, 2), 1)
