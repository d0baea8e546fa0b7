"""The zoo's Llama family: shapes and parameter counts as Meta published them, capture recognises every
op, FLOPs equal the hand count (6·N·tokens + attention), and `sapp search --runtime fused` plans it
and re-scores the plan with the same runtime.  The 8B / 405B captures run on the meta device (~5 s)."""
import json

import pytest

import sapp.models as zoo
from sapp.api import capture_graph
from sapp.commands.cli import main
from sapp.errors import SappError

# Meta's published totals (Llama 3 model card / paper): 8.03B, 70.6B, 405.9B (rounded as printed)
PUBLISHED = {"llama3-8b": 8.03e9, "llama3-70b": 70.6e9, "llama3-405b": 405.9e9}


def test_llama3_405b_shape_and_param_counts():
    c = zoo.info("llama3-405b")["config"]
    assert (c["l"], c["h"], c["a"], c["kv"], c["ffn"], c["V"]) == (126, 16384, 128, 8, 53248, 128256)
    for name, n in PUBLISHED.items():
        assert zoo.info(name)["params"] == pytest.approx(n, rel=0.002), name


def test_tiny_param_count_matches_module():
    m = zoo.get("llama-tiny", device="cpu")
    assert sum(p.numel() for p in m.parameters()) == zoo.info("llama-tiny")["params"]
    assert m.head.weight is not m.embed.weight                      # untied


def test_kv_heads_must_divide_heads():
    with pytest.raises(SappError, match="kv=3"):
        zoo.get("llama-tiny", kv=3)


@pytest.mark.parametrize("name", ["llama-tiny", "llama3-8b", "llama3-405b"])
def test_capture_knows_every_op_and_flops_match_hand_count(name):
    g = capture_graph(zoo.get(name))[0]
    assert g.meta.get("unknown_ops") == []
    c = zoo.info(name)["config"]
    l, h, V, s = c["l"], c["h"], c["V"], c["s"]
    tokens = g.batch_size * s
    n_params = zoo.info(name)["params"] - V * h - (2 * l + 1) * h    # the lookup and the norm weights do no GEMM
    hand = 6.0 * n_params * tokens + 3 * l * 4.0 * s * h * tokens    # + q·kᵀ and ·v over the whole sequence
    assert g.param_count() == zoo.info(name)["params"]
    assert 3 * g.total_flops() == pytest.approx(hand, rel=0.01 if name != "llama-tiny" else 0.03)
    gemm = sum(n.flops for n in g.nodes.values() if n.kind in ("matmul", "attention"))
    assert 3 * gemm == pytest.approx(hand, rel=1e-9)                 # exactly, GEMMs alone
    att = [n for n in g.nodes.values() if n.kind == "attention"]
    assert len(att) == l and all(n.extra["causal"] for n in att)


def test_sapp_search_llama_with_fused_runtime(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(["search", "--model", "llama-tiny", "--cluster", "a100-80g:nodes=1", "--batch", "8",
               "--runtime", "fused", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    d = json.loads(out.read_text())
    assert d["settings"]["runtime"] == "fused"
    capsys.readouterr()
    rc = main(["evaluate", str(out), "--model", "llama-tiny"])
    text = capsys.readouterr().out
    assert rc == 0 and "plan says" in text
    # the re-score uses the plan's runtime: the same prediction
    import sapp
    from sapp.plan import Plan
    res = sapp.evaluate("llama-tiny", None, Plan.load(str(out)))
    assert res["step_time_s"] == pytest.approx(d["predicted"]["step_time_s"], rel=1e-5)
