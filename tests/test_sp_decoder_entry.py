"""Sequence parallelism and an encoder-decoder's decoder (issue 26: the catalogue's encoder-decoder and
Pegasus rows).  The encoder's sequence-split output is read by every decoder layer's cross-attention;
the module where it could be gathered whole is the decoder, which holds a stack of blocks and takes
several inputs - the emitter cannot tell which is the shard and refuses (sp_entry.check_entries).
The search turned SP on there when it was free, so even a plain tp=2 search was refused; now that
entry is an unsupported piece: SP is not priced, and tp=2 runs its regions without it."""
import os
import sys

import torch
from torch import nn
from torch.nn import functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

D, FF, SEQ, VOCAB, BATCH = 64, 128, 16, 128, 4
TP_CLUSTER = "cpu:gpus=2,peak_flops=1e8,intra_latency=0,intra_bw=1e15,op_overhead=0,sharded_op_overhead=0"


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(D), nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class CrossLayer(nn.Module):
    """A decoder layer: an MLP on its own stream plus k/v read from the encoder's output."""

    def __init__(self):
        super().__init__()
        self.ln, self.q, self.k, self.v, self.o = (nn.LayerNorm(D), nn.Linear(D, D), nn.Linear(D, D),
                                                   nn.Linear(D, D), nn.Linear(D, D))
        self.mlp = Mlp()

    def forward(self, x, enc):
        h = self.ln(x)
        a = torch.softmax(self.q(h) @ self.k(enc).transpose(-1, -2) / D ** 0.5, dim=-1) @ self.v(enc)
        return self.mlp(x + self.o(a))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList([CrossLayer(), CrossLayer()])

    def forward(self, ids, enc):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x, enc)
        return x


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc_emb = nn.Embedding(VOCAB, D)
        self.encoder = nn.ModuleList([Mlp(), Mlp()])
        self.enc_ln = nn.LayerNorm(D)
        self.decoder = Decoder()
        self.head = nn.Linear(D, VOCAB)

    def forward(self, src, tgt):
        e = self.enc_emb(src)
        for m in self.encoder:
            e = m(e)
        return self.head(self.decoder(tgt, self.enc_ln(e)))


def _ce(out, y):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def test_decoder_holding_blocks_is_no_sp_entry():
    from sapp.capture import capture
    from sapp.search import tp_layout
    from sapp.search.sp_layout import sp_with_table
    torch.manual_seed(0)
    src, tgt = torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ))
    graph = capture(Seq2Seq(), (src, tgt))
    strategies, _, _ = tp_layout.emittable(graph, {n: "n" for n in tp_layout.linears(graph)}, 2)
    _, sec = sp_with_table(graph, strategies, 2)
    assert "decoder" not in sec.get("entries", {}), sec
    assert any(u.startswith("decoder holds a stack of blocks") for u in sec["unsupported"]), sec["unsupported"]


def test_free_sp_search_shards_without_sp():
    from sapp.api import search
    from sapp.emit.tp import sp_entry
    torch.manual_seed(0)
    src, tgt = torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ))
    with torch.device("meta"):
        model = Seq2Seq()
    plan = search(model, TP_CLUSTER, global_batch=BATCH, example_inputs=(src, tgt), loss_fn=_ce, targets=tgt,
                  constraints={"dp": 1, "tp": 2, "pp": 1, "zero": 0})
    assert plan.parallel["tp"] == 2 and plan.tp_modules, plan.tp_modules
    sec = (plan.tp_layout or {}).get("sp") or {}
    # what the emitter would refuse is not in the plan
    sp_entry.check_entries(sec, dict(Seq2Seq().named_modules()), ["decoder.layers.0", "decoder.layers.1",
                                                                  "encoder.0", "encoder.1"])
    assert not plan.parallel.get("sp")


def test_hf_encoder_decoder_tp2_plan_has_no_unplaceable_sp(tmp_path):
    """transformers' EncoderDecoderModel (BERT + BERT, the catalogue's tiny config): SP priced on the
    block template looked placeable; on the whole graph the decoder gathers the encoder's output.  A
    free tp=2 search now returns tp without SP (before: sp on, and emit refused the plan)."""
    import json

    import pytest
    pytest.importorskip("transformers")
    from tests.emit_workers import hf_plans
    with open(hf_plans.search_plan("cat:encoder-decoder", "tp2", tmp_path / "p.json")) as f:
        plan = json.load(f)
    assert plan["parallel"]["tp"] == 2 and plan["tp_modules"]
    assert not plan["parallel"].get("sp") and "sp" not in plan["tp_layout"], plan["parallel"]


class ScaledDecoder(nn.Module):
    """Granite's decoder model, reduced: the embedding scaled by a constant in the module that also
    computes positions from the scaled tensor's length and runs the blocks.  A sequence cut at the
    embedding (where the scale sums it) made the positions those of the shard: the step failed at
    `q * cos` (16 against 8), and a model whose numbers happened to fit would have run wrong."""

    def __init__(self):
        super().__init__()
        self.emb, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(SEQ, D)
        self.layers = nn.ModuleList([Mlp(), Mlp()])
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids):
        x = self.emb(ids) * 2.0
        x = x + self.pos(torch.arange(x.shape[1], device=x.device))
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_embedding_scaled_in_the_module_running_the_blocks_is_not_cut_there():
    from sapp.capture import capture
    from sapp.search import tp_layout
    from sapp.search.sp_layout import sp_with_table
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    graph = capture(ScaledDecoder(), (ids,))
    strategies, _, _ = tp_layout.emittable(graph, {n: "n" for n in tp_layout.linears(graph)}, 2)
    _, sec = sp_with_table(graph, strategies, 2)
    assert "emb" not in sec.get("scatter", {}), sec
    assert any("also runs the blocks" in u for u in sec["unsupported"]), sec["unsupported"]
