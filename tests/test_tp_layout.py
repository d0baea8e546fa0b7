"""sapp.search.tp_layout: tensor-parallel layouts derived from the captured graph of models without
the zoo's naming (tiny HF configs on meta), in the one form DTensor runs."""
import os
import sys

import pytest

pytest.importorskip("transformers")

from sapp.search import tp_layout  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.emit_workers import hf_models  # noqa: E402

_GRAPHS = {}


def _graph(kind):
    if kind not in _GRAPHS:
        from sapp.api import capture_graph
        model, _ = hf_models.build(kind, device="meta")
        x, _ = hf_models.batch(kind, 8, 0)
        _GRAPHS[kind] = capture_graph(model, x)[0]
    return _GRAPHS[kind]


def _by_module(graph, choice_by_suffix):
    """{node: dim} choosing `dim` for linears whose module ends with a given suffix."""
    out = {}
    for n in tp_layout.linears(graph):
        mod = graph.nodes[n].module
        for suffix, d in choice_by_suffix.items():
            if mod.endswith(suffix):
                out[n] = d
    return out


def _styles(graph, choice, tp=2):
    strategies, used, notes = tp_layout.emittable(graph, choice, tp)
    styles, groups, more = tp_layout.modules(graph, {n: (d,) for n, d in strategies.items()}, [0])
    return styles, groups, notes + more


def test_transposed_llama_pick_becomes_the_megatron_form():
    # what the search picks at 7B dims: q/k/v split by rows, o_proj by columns (DTensor cannot run it)
    g = _graph("llama")
    choice = _by_module(g, {"q_proj": "k", "k_proj": "k", "v_proj": "k", "o_proj": "n",
                            "gate_proj": "n", "up_proj": "n", "down_proj": "k"})
    styles, groups, _ = _styles(g, choice)
    for i in (0, 1):
        a = f"model.layers.{i}.self_attn."
        assert [styles[a + p] for p in ("q_proj", "k_proj", "v_proj", "o_proj")] == ["colwise"] * 3 + ["rowwise"]
        m = f"model.layers.{i}.mlp."
        assert [styles[m + p] for p in ("gate_proj", "up_proj", "down_proj")] == ["colwise", "colwise", "rowwise"]
        assert [a + p for p in ("q_proj", "k_proj", "v_proj", "o_proj")] in groups
    assert "lm_head" not in styles          # not chosen: stays replicated


def test_every_op_between_opener_and_closer_splits_whole_heads():
    g = _graph("llama")
    choice = _by_module(g, {"q_proj": "n", "o_proj": "k"})
    strategies, used, _ = tp_layout.emittable(g, choice, 2)
    attn = next(r for r in used if g.nodes[r.openers[0]].module.endswith("layers.0.self_attn.q_proj"))
    assert [g.nodes[o].module.rsplit(".", 1)[1] for o in attn.openers] == ["q_proj", "k_proj", "v_proj"]
    scores = [n for n in attn.dims if g.nodes[n].kind == "matmul" and not g.nodes[n].params]
    assert scores and all(strategies[n] == "b1" for n in scores)       # the heads dim of q.k^T and p.v
    softmax = [n for n in attn.dims if g.nodes[n].kind == "softmax"]
    assert softmax and all(g.nodes[n].dim(strategies[n]).size == 4 for n in softmax)   # 4 heads, 2 per rank
    # ops outside any region are replicated on the tp level
    norms = [n for n, node in g.nodes.items() if node.module.endswith("input_layernorm")]
    assert norms and all(strategies[n] is None for n in norms)


def test_nothing_chosen_is_replication_and_says_so():
    g = _graph("llama")
    styles, groups, notes = _styles(g, {})
    assert styles == {} and groups == []
    assert any("shards nothing" in n and "replication" in n for n in notes)


def test_lone_column_split_head_is_gathered():
    g = _graph("vit")
    styles, _, _ = _styles(g, _by_module(g, {"classifier": "n", "fc1": "n", "fc2": "k"}))
    assert styles["classifier"] == "colwise_gather"
    assert styles["vit.layers.0.mlp.fc1"] == "colwise" and styles["vit.layers.0.mlp.fc2"] == "rowwise"


def test_tied_table_splits_by_vocabulary_in_both_uses_or_neither():
    g = _graph("bert")
    lin = {g.nodes[n].module for n in tp_layout.linears(g)}
    assert "cls.predictions.decoder" not in lin         # its weight is the word embedding's: not a lone linear
    (param, embs, heads), = tp_layout.tied_tables(g)
    assert [g.nodes[e].module for e in embs] == ["bert.embeddings.word_embeddings"]
    assert [g.nodes[h].module for h in heads] == ["cls.predictions.decoder"]
    # the search cutting either use splits both by rows of the one weight (Megatron's vocab-parallel
    # embedding and output layer); cutting neither splits neither
    for picked in ({heads[0]: "n"}, {embs[0]: "v"}):
        styles, _, _ = _styles(g, picked)
        assert styles["bert.embeddings.word_embeddings"] == "vocab"
        assert styles["cls.predictions.decoder"] == "colwise_gather"
    styles, _, _ = _styles(g, {})
    assert "cls.predictions.decoder" not in styles and "bert.embeddings.word_embeddings" not in styles
    # a vocabulary that does not divide keeps both whole (bert's tiny vocabulary: 256)
    styles, _, _ = _styles(g, {heads[0]: "n"}, tp=3)
    assert "cls.predictions.decoder" not in styles and "bert.embeddings.word_embeddings" not in styles


def test_tied_table_split_is_priced_at_its_share():
    """The one weight, split by vocabulary, is priced at 1/tp a rank (states and the head's work),
    the head's output gathered: what the emitter runs (test_hf_emit's bert cases)."""
    from sapp.cluster import Cluster
    from sapp.costmodel import CostSettings, evaluate_sharding
    from sapp.cluster.mesh import Level, Mesh
    g = _graph("bert")
    (param, embs, heads), = tp_layout.tied_tables(g)
    mesh, cl, st = Mesh((Level(2, "intra"),)), Cluster.parse("h100-80g:devices=2"), CostSettings(precision="fp32")
    whole = {n: (None,) for n in g.nodes}
    split = dict(whole, **{e: ("v",) for e in embs}, **{h: ("n",) for h in heads})
    a, b = evaluate_sharding(g, whole, mesh, cl, st), evaluate_sharding(g, split, mesh, cl, st)
    # the table once (not once a use) and the head's bias, both at half a rank, fp32
    split_params = g.params[param].numel + g.params["cls.predictions.decoder.bias"].numel
    assert a.param_bytes - b.param_bytes == pytest.approx(split_params * 4 / 2, rel=1e-6)
    assert b.reshard_s > a.reshard_s                      # the gathered logits and the reduced lookup


def test_heads_that_do_not_divide_keep_the_region_replicated():
    g = _graph("llama")                  # 2 key/value heads: tp=4 cannot give each rank whole kv heads
    choice = _by_module(g, {"q_proj": "n", "o_proj": "k", "gate_proj": "n", "down_proj": "k"})
    styles, _, notes = _styles(g, choice, tp=4)
    assert "model.layers.0.self_attn.q_proj" not in styles
    assert styles["model.layers.0.mlp.gate_proj"] == "colwise"       # 128 features split 4 ways
    assert any("self_attn.q_proj" in n and "stays replicated" in n for n in notes)


def test_t5_attention_with_position_bias_stays_replicated():
    try:
        g = _graph("t5")
    except Exception as e:                    # capture of T5 comes with the capture work of issue 13
        pytest.skip(f"T5 does not capture here: {type(e).__name__}")
    choice = _by_module(g, {".q": "n", ".k": "n", ".v": "n", ".o": "k", "wi": "n", "wo": "k"})
    styles, _, notes = _styles(g, choice)
    assert styles["model.encoder.block.0.layer.1.DenseReluDense.wi"] == "colwise"
    assert "model.encoder.block.0.layer.0.SelfAttention.q" not in styles
    assert any("SelfAttention" in n and "unsplit" in n for n in notes)


def test_long_sequence_pick_falls_back_to_the_region_layout():
    """At long sequences the sharding search splits every op along the sequence on the tp level
    (weights replicated) - no form DTensor runs, which `emittable` reduces to replication.  search_fn
    then keeps the region layout instead: faster, and the layout a pinned tp runs."""
    import torch
    import transformers as T
    from sapp.api import capture_graph, resolve_cluster
    from sapp.costmodel import CostSettings, evaluate_sharding
    from sapp.cluster.mesh import Level, Mesh
    from sapp.search import shard_search
    cfg = T.LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=8192,
                        use_cache=False, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = T.LlamaForCausalLM(cfg)
    g, _ = capture_graph(model, (torch.zeros(1, 8192, dtype=torch.long, device="meta"),))
    cl = resolve_cluster("a100-80g:nodes=1")
    st, mesh = CostSettings(precision=cl.precision), Mesh((Level(4, "intra"),))
    lin = tp_layout.linears(g)
    raw = shard_search(g, mesh, cl, st, level_roles=("tp",))
    assert not any(raw.strategies[n][0] in ("n", "k") for n in lin)     # the scenario: no weight cut
    replicated, _, _ = tp_layout.emittable(g, {n: s[0] for n, s in raw.strategies.items()}, 4)
    assert all(d is None for n, d in replicated.items() if n in lin)
    res = tp_layout.search_fn(g, mesh, cl, st, level_roles=("tp",))
    want = {"q_proj": "n", "k_proj": "n", "v_proj": "n", "o_proj": "k", "gate_proj": "n", "up_proj": "n",
            "down_proj": "k"}
    for n in lin:
        mod = g.nodes[n].module
        if mod != "lm_head":
            assert res.strategies[n] == (want[mod.rsplit(".", 1)[1]],), mod
    assert res.method.endswith("+regions")

    def step(s):
        return evaluate_sharding(g, s, mesh, cl, st).step_time_s
    assert step(res.strategies) < step({n: (d,) for n, d in replicated.items()})


def test_megatron_fallback_layout_also_splits_the_lm_head():
    """At long sequences the sharding search splits every op along the sequence on the tp level (no
    DTensor form), and the layout that shards every valid region is priced beside it (`+regions`).  That
    layout left the LM head (a lone column split, no region) replicated: every tp rank computed the whole
    vocabulary's head (Llama-3-405B at 131072 tokens: the last stage ~2 blocks slower).  Megatron splits the
    output layer too; the fallback now prices it split (output gathered) and keeps it where faster."""
    import torch
    import transformers as T
    from sapp.capture import capture
    from sapp.cluster import Cluster
    from sapp.costmodel import CostSettings, evaluate_sharding
    from sapp.cluster.mesh import Level, Mesh
    cfg = T.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                        vocab_size=4096, max_position_embeddings=8192, use_cache=False, num_key_value_heads=2)
    with torch.device("meta"):
        m = T.LlamaForCausalLM(cfg)
    g = capture(m, (torch.empty(4, 8192, dtype=torch.long, device="meta"),))
    mesh, cl, st = Mesh((Level(2, "intra"),)), Cluster.parse("h100-80g:devices=2"), CostSettings(runtime="fused")
    r = tp_layout.search_fn(g, mesh, cl, st, level_roles=("tp",))
    head = next(n for n, nd in g.nodes.items() if nd.module == "lm_head")
    assert r.method.endswith("+regions") and r.strategies[head] == ("n",)
    styles, _, _ = tp_layout.modules(g, {n: s for n, s in r.strategies.items()}, [0])
    assert styles["lm_head"] == "colwise_gather"
    # and it is the faster of the two: the same layout with the head replicated prices slower
    rep = dict(r.strategies, **{head: (None,)})
    assert evaluate_sharding(g, r.strategies, mesh, cl, st).step_time_s < evaluate_sharding(g, rep, mesh, cl, st).step_time_s
