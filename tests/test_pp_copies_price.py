"""A weight several pipeline stages hold is priced on each of them, with the all-reduce that sums its
copies' gradients (sapp/search/joint/copies.py; issue 51 item 1: "priced accordingly").  The emitter
copies a tied table into the last stage and sums the copies' gradients there (emit/pp/pipe.TiedGrads,
Megatron's embedding group); the search counted the table on the first stage only and no sum at all.
Independent checks: a tied model's last stage holds what the same model with an untied head holds
there (the head's table either way), and the sum is one all-reduce of the table's gradient over the
two pipeline ranks, by the cost model's collective formula."""
import torch
from torch import nn

from sapp.api import search

B, S, D, V, LAYERS = 4, 8, 16, 64, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.n, self.f = nn.LayerNorm(D), nn.Linear(D, D)

    def forward(self, x):
        return x + self.f(self.n(x))


class LM(nn.Module):
    def __init__(self, tied: bool):
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(D, V, bias=False)
        if tied:
            self.head.weight = self.tok.weight

    def forward(self, ids):
        h = self.tok(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(h).flatten(0, 1)


def _loss(out, y):
    return nn.functional.cross_entropy(out, y)


def _plan(tied):
    torch.manual_seed(0)
    ids = torch.randint(0, V, (B, S + 1))
    return search(LM(tied), "cpu:gpus=2", global_batch=B, example_inputs=(ids[:, :-1],), loss_fn=_loss,
                  targets=ids[:, 1:].reshape(-1),
                  constraints={"dp": 1, "tp": 1, "pp": 2, "zero": 0, "micro_batches": 2, "schedule": "1f1b"})


def test_a_tied_table_is_priced_on_both_stages_with_its_gradient_sum():
    from sapp.cluster import Cluster
    from sapp.costmodel import collective_time
    tied, untied = _plan(True), _plan(False)
    mem = [[s["predicted"]["memory"][k] for k in ("params", "grads", "optimizer")] for s in tied.pipeline["stages"]]
    ref = [[s["predicted"]["memory"][k] for k in ("params", "grads", "optimizer")] for s in untied.pipeline["stages"]]
    assert [s["blocks"] for s in tied.pipeline["stages"]] == [s["blocks"] for s in untied.pipeline["stages"]]
    # the last stage holds the head's table, tied or not; the first the embedding's
    assert mem == ref, (mem, ref)
    table = V * D * 4                   # float32 gradient of the one table
    want = collective_time("all_reduce", table, 2, "intra", Cluster.parse("cpu:gpus=2"))
    got = tied.predicted["comm_by_kind"].get("pp_tied_grads")
    assert got is not None and abs(got - want) <= 1e-12 + 1e-6 * want, (got, want)
    assert "pp_tied_grads" not in untied.predicted["comm_by_kind"]


def test_shared_weights_reads_readers_and_the_units_that_count_them():
    from sapp.capture import capture
    from sapp.pipeline.units import shared_weights, split_units
    from sapp.cluster.mesh import Mesh
    torch.manual_seed(0)
    g = capture(LM(True), (torch.randint(0, V, (2, S)),))
    units = split_units(g)
    strategies = {n: () for n in g.nodes}
    got = shared_weights(g, units, g, strategies, Mesh(()))
    names = [u.name for u in units]
    assert len(got) == 1, got
    w = got[0]
    assert [names[j] for j in w.readers] == ["prologue", "epilogue"], (names, w)
    assert [names[j] for j in w.counted] == ["prologue"] and w.row[0] == V * D and w.row[3], w
