"""Sequence parallelism where the module running the blocks builds what they read from the embedding's
length (issue 26: XLM-RoBERTa-XL tp2 and tp2+sp failed at step 0, "size of tensor a (16) must match
the size of tensor b (8)").  Its embeddings module sums the tables, and the SP section cut them there
(`scatter`), as for sapp's GPT; but the model module then builds the causal mask from the summed
output's shape - for a shard, a mask over 8 keys against scores over 16.  The cut now moves to where
the first block takes the stream in (`block_scatter`), so the mask is built for the whole sequence."""
import torch
from torch import nn
from torch.nn import functional as F

D, FF, SEQ, VOCAB, BATCH, H = 64, 128, 16, 128, 4, 4


class Embeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.word, self.pos, self.drop = nn.Embedding(VOCAB, D), nn.Embedding(SEQ, D), nn.Dropout(0.0)

    def forward(self, ids):
        return self.drop(self.word(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device)))


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))

    def forward(self, h, mask):
        b, s, _ = h.shape
        q, k, v = (f(h).view(b, s, -1, D // H).transpose(1, 2) for f in (self.q, self.k, self.v))
        a = torch.softmax(q @ k.transpose(-1, -2) / (D // H) ** 0.5 + mask, dim=-1) @ v
        return self.o(a.transpose(1, 2).reshape(b, s, -1))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = Attention()
        self.fc1, self.fc2 = nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, x, mask):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.ModuleList([Layer(), Layer()])
        self.ln = nn.LayerNorm(D)

    def forward(self, x, mask):
        for m in self.layer:
            x = m(x, mask)
        return self.ln(x)


class MaskFromLength(nn.Module):
    """XLM-RoBERTa-XL's shape: the model module builds the causal mask from the embeddings' output
    length, then runs the encoder's blocks."""

    def __init__(self):
        super().__init__()
        self.embeddings, self.encoder, self.head = Embeddings(), Encoder(), nn.Linear(D, VOCAB)

    def forward(self, ids):
        e = self.embeddings(ids)
        s = e.shape[1]
        pos = torch.arange(s, device=e.device)
        mask = torch.where(pos[None, :] <= pos[:, None], 0.0, -1e9)[None, None]
        return self.head(self.encoder(e, mask))


def _section(model):
    from sapp.capture import capture
    from sapp.search import tp_layout
    from sapp.search.sp_layout import sp_with_table
    graph = capture(model, (torch.randint(0, VOCAB, (BATCH, SEQ)),))
    strategies, _, _ = tp_layout.emittable(graph, {n: "n" for n in tp_layout.linears(graph)}, 2)
    return sp_with_table(graph, strategies, 2)[1]


def test_mask_built_from_the_cut_length_moves_the_cut_to_the_first_block():
    torch.manual_seed(0)
    sec = _section(MaskFromLength())
    assert not sec["scatter"] and not sec["unsupported"], sec
    assert sec["block_scatter"] == {"encoder.layer.0": 1}, sec


def test_gpt_like_embedding_keeps_its_cut():
    """Nothing but the blocks reads the summed embedding (sapp's GPT): cut where it is summed, as before."""
    class NoMask(MaskFromLength):
        def forward(self, ids):
            return self.head(self.encoder(self.embeddings(ids), 0.0))
    torch.manual_seed(0)
    sec = _section(NoMask())
    assert set(sec["scatter"]) == {"embeddings.word", "embeddings.pos"} and not sec["block_scatter"], sec


def test_sp_run_equals_one_process(tmp_path):
    """tp=2 with SP pinned, 2 gloo processes, 3 steps: the same losses as one process (before: step 0
    failed on the mask's shape)."""
    from tests.emit_workers import custom_sp_run
    got, ref, plan = custom_sp_run.run(MaskFromLength, tmp_path)
    assert plan.parallel.get("sp") and plan.tp_layout["sp"]["block_scatter"] == {"encoder.layer.0": 1}
    assert len(got) == len(ref) == 3
    assert max(abs(a - b) / abs(b) for a, b in zip(got, ref)) <= 1e-5, (got, ref)
