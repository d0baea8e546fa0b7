"""Sequence parallelism for an attention module called with two tensor arguments (issue 51, item 2):
torchtune's `attn(h, h)` (queries from the first, keys and values from the second) and a cross-stream
form `attn(h, kv)` whose second argument is another sequence-split norm's output.  The SP entry hook
gathered only the first tensor argument, so keys and values came from this rank's half of the
sequence (3.5e-4 off one process at step 0, silently).  It now gathers every tensor argument that is a
sequence shard of the activation's (same rank, same batch and sequence extent: sp._carries_sequence),
the same tensor once.  Float64 model and data: a correct layout agrees with one process to ~1e-15."""
import torch
from torch import nn
from torch.nn import functional as F

D, FF, SEQ, VOCAB, BATCH, H = 32, 64, 8, 64, 4, 4


class TwoInputAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))

    def forward(self, x, y):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, -1, D // H).transpose(1, 2)
        k, v = (f(y).view(b, y.shape[1], -1, D // H).transpose(1, 2) for f in (self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, s, -1))


class Layer(nn.Module):
    def __init__(self, same):
        super().__init__()
        self.same = same
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.ln_kv = None if same else nn.LayerNorm(D)
        self.attn = TwoInputAttention()
        self.fc1, self.fc2 = nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h if self.same else self.ln_kv(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Embeddings(nn.Module):
    """Token + position tables summed in their own module (where SP cuts the stream)."""

    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(SEQ, D)

    def forward(self, ids):
        return self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))


class TwoInputDecoder(nn.Module):
    """Layer 0 calls attn(h, h) (torchtune), layer 1 attn(h, ln_kv(x)); float64 throughout."""

    def __init__(self):
        super().__init__()
        self.emb = Embeddings()
        self.layers = nn.ModuleList([Layer(True), Layer(False)])
        self.norm, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB)
        self.double()

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def test_two_argument_attention_under_sp_equals_one_process(tmp_path):
    """tp=2 with SP pinned, 2 gloo processes, 3 steps, float64: one process's losses to 1e-10 (before:
    3.5e-4 off at step 0 - keys and values from half the sequence)."""
    from tests.emit_workers import custom_sp_run
    got, ref, plan = custom_sp_run.run(TwoInputDecoder, tmp_path)
    sec = plan.tp_layout["sp"]
    assert plan.parallel.get("sp") and any(n.endswith(".attn") for n in sec["entries"]), sec
    assert len(got) == len(ref) == 3
    diff = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    assert diff <= 1e-10, (diff, got, ref)


def test_carries_sequence_picks_shards_not_masks_or_positions():
    from sapp.emit.tp.sp import _carries_sequence
    x = torch.zeros(2, 4, 8)
    assert _carries_sequence(x, torch.zeros(2, 4, 16), 1)          # keys/values of another width
    assert not _carries_sequence(x, torch.zeros(2, 1, 8, 8), 1)    # a mask
    assert not _carries_sequence(x, torch.zeros(2, 8), 1)          # positions over the whole sequence
    assert not _carries_sequence(x, torch.zeros(2, 8, 8), 1)       # the whole sequence, not a shard
