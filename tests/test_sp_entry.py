"""Sequence parallelism cut at the blocks' input when a sequence-parallel norm runs before them
(sapp/emit/tp/sp_entry.py).  On the code before it ERNIE tp2 (the search picks SP) stopped at step 0:
ErnieModel builds its attention mask from the embeddings' output, which the embeddings LayerNorm had
cut to the shard (a mask over 8 keys for scores over 16).  Unit cases on module trees of our own, and
ERNIE from the catalogue on 2 gloo ranks against one process (one spawned job, ~30 s CPU)."""
import os
import sys

import pytest
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from sapp.emit.recompute.checkpointing import block_names  # noqa: E402
from sapp.emit.tp.sp_entry import relayout  # noqa: E402


def tree(spec):
    root = nn.Module()
    for name, mod in spec:
        parent = root.get_submodule(name.rpartition(".")[0]) if "." in name else root
        setattr(parent, name.rpartition(".")[2], mod)
    return root


def _bert():
    return tree([("emb", nn.Module()), ("emb.word", nn.Embedding(4, 4)), ("emb.pos", nn.Embedding(4, 4)),
                 ("emb.LayerNorm", nn.LayerNorm(4)), ("enc", nn.Module()),
                 ("enc.layer", nn.ModuleList([nn.Module(), nn.Module()])), ("head", nn.Linear(4, 4))])


BERT_SEC = {"scatter": {"emb.word": 1, "emb.pos": 0}, "norms": {"emb.LayerNorm": 1, "enc.layer.0": 1},
            "entries": {"head": 1}, "exits": {}, "block_scatter": {}}


def test_norm_before_the_blocks_moves_the_cut_to_the_first_block():
    m = _bert()
    out, moved = relayout(BERT_SEC, m, {}, block_names(m))
    assert moved == ["emb.LayerNorm", "emb.pos", "emb.word"]
    assert out["scatter"] == {} and out["norms"] == {"enc.layer.0": 1}
    assert out["block_scatter"] == {"enc.layer.0": 1}          # the block's own axis, not the position table's
    assert out["entries"] == {"head": 1}                      # the head after the blocks keeps its gather


def test_what_cannot_move_stays_as_planned():
    m = _bert()
    out, moved = relayout(BERT_SEC, m, {"emb.word": "vocab"}, block_names(m))   # a vocab-split table moves too:
    assert moved and out["scatter"] == {} and out["block_scatter"] == {"enc.layer.0": 1}   # all-reduced, not cut
    early = dict(BERT_SEC, entries={"emb.word": 1})                                        # read before the blocks
    assert relayout(early, m, {}, block_names(m)) == (early, [])
    gpt = dict(BERT_SEC, norms={"enc.layer.0": 1})                                          # no norm before the blocks
    assert relayout(gpt, m, {}, block_names(m)) == (gpt, [])
    final = dict(BERT_SEC, scatter={}, norms={"enc.layer.0": 1, "enc.norm": 1})            # a final norm
    m.enc.norm = nn.LayerNorm(4)
    assert relayout(final, m, {}, block_names(m)) == (final, [])


@pytest.fixture(scope="module")
def ernie(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.emit_workers import hf_harness
    return hf_harness.job(2, [("cat:ernie", "tp2")], tmp_path_factory.mktemp("ernie"), 3)


def test_ernie_tp2_sp_equals_one_process(ernie):
    cases, plans = ernie
    res = cases["cat:ernie-tp2"]
    assert plans["cat:ernie-tp2"]["parallel"]["sp"] is True
    ref = res["ref"]
    for g in res["ranks"].values():
        assert "error" not in g, g
        assert max(abs(a - b) / abs(b) for a, b in zip(g["losses"], ref)) <= 1e-5, (g["losses"], ref)
        assert g["dtensor_params"] > 0
        assert any("cut at the blocks' input, not at ernie.embeddings.LayerNorm" in n for n in g["notes"]), g["notes"]


def test_an_entry_holding_blocks_is_refused_in_one_line():
    """Encoder-decoder + SP: the plan gathers the decoder module's input, and the hook would take its
    token ids, leaving the encoder output cut for cross-attention (refused before anything runs)."""
    from sapp.emit.tp import sp
    from sapp.errors import PlanError
    m = tree([("enc", nn.Module()), ("enc.layers", nn.ModuleList([nn.Module()])), ("dec", nn.Module()),
              ("dec.layers", nn.ModuleList([nn.Module()]))])
    sec = {"entries": {"dec": 1}, "norms": {"enc.layers.0": 1}, "scatter": {}, "exits": {}}
    with pytest.raises(PlanError) as e:
        sp.apply(m, sec, None, {}, [])
    assert "\n" not in str(e.value) and "dec (Module) holds a stack of blocks" in str(e.value)
