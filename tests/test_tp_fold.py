"""Heads folded into the data batch (sapp/search/tp_fold.py): the layout carries the split on the merged
axis from the merge to the unmerge, the cost model prices that as no move (costmodel/edges.fold_src /
fold_dst), and a model that folds the heads any other way keeps its attention replicated with the
reason named.  On meta graphs: no process is started."""
import importlib.util

import pytest
import torch
from torch import nn

from sapp.capture import capture
from sapp.search import tp_layout


class _Folded(nn.Module):
    """Attention over q, k, v packed as `(b h) n d` (local-attention's layout); `unfold` the shape the
    output is unpacked to, from the packed [(b h), n, d] (None: back to [b, h, n, d])."""

    def __init__(self, heads=4, dim=32, unfold=None):
        super().__init__()
        self.heads, self.unfold = heads, unfold
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = (t.reshape(b, n, self.heads, -1).transpose(1, 2).reshape(b * self.heads, n, -1)
                   for t in self.qkv(x).chunk(3, dim=-1))
        o = torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v
        o = o.reshape(*(self.unfold or (b, self.heads)), n, -1).transpose(1, 2).reshape(b, n, c)
        return self.out(o)


def _graph(model, batch=2):
    x = torch.zeros(batch, 8, 32, device="meta")
    return capture(model.to("meta"), (x,), target=torch.zeros(batch, 8, 32, device="meta"),
                   loss_fn=lambda y, t: ((y - t) ** 2).mean())


def _region(graph):
    return next(r for r in tp_layout.regions(graph, 2) if graph.nodes[r.openers[0]].module == "qkv")


def test_heads_ride_the_folded_batch_and_move_no_byte():
    """The region is valid, the ops between the pack and the unpack run over the merged batch with the
    fold (outer, heads, inner) recorded, and the plan's layout is priced with no resharding at the pack
    or the unpack: what each rank runs on its own rows."""
    from sapp.cluster import Cluster
    from sapp.cluster.mesh import Level, Mesh
    from sapp.costmodel import CostSettings, evaluate_sharding
    g = _graph(_Folded())
    r = _region(g)
    assert not r.why, r.why
    assert set(r.folds.values()) == {(2, 4, 1)}, r.folds
    assert all(g.nodes[n].out.dims.index(r.dims[n]) == 0 for n in r.folds)     # the merged batch axis
    strategies, used, _ = tp_layout.emittable(g, {n: "n" for n in r.openers}, 2)
    assert used and all(strategies[n] == d for n, d in r.dims.items())
    mesh, cl, st = Mesh((Level(2, "intra"),)), Cluster.parse("h100-80g:devices=2"), CostSettings(precision="fp32")
    res = evaluate_sharding(g, {n: (d,) for n, d in strategies.items()}, mesh, cl, st)
    folds = [n for n, node in g.nodes.items() if node.extra.get("folds") and n in r.dims]
    assert len(folds) >= 4, folds                          # the three packs and the unpack
    assert all(res.per_node[n]["reshard_s"] == 0 for n in folds), {n: res.per_node[n]["reshard_s"] for n in folds}


@pytest.mark.parametrize("unfold, why", [((4, 2), "splits the batch the heads are folded into as [4, 2]"),
                                         ((8,), "reshapes")])
def test_a_fold_split_back_elsewhere_keeps_the_attention_whole(unfold, why):
    """Unpacking the merged batch at other sizes than it was packed (b*h as (h, b): every rank's rows
    would be other heads') refuses the region, in one line naming the reshape."""
    g = _graph(_Folded(unfold=unfold))
    r = _region(g)
    assert r.why and "\n" not in r.why, r.why
    if unfold == (4, 2):
        assert why in r.why, r.why


def test_unfold_and_movedim_are_views_the_split_passes():
    """Tensor.unfold (local-attention's look-around) and movedim are mapped views: no unknown op, the
    windowed axis and the new window axis kept whole, every other axis mapped straight."""
    class Windows(nn.Module):
        def forward(self, x):
            return x.unfold(1, 2, 1).movedim(-1, 2)

    g = capture(Windows(), (torch.zeros(4, 3, 8, device="meta"),))
    unfold = next(n for n in g.nodes.values() if str(n.target) == "aten.unfold.default")
    move = next(n for n in g.nodes.values() if str(n.target) == "aten.movedim.int")
    assert not unfold.extra.get("generic") and not move.extra.get("generic")
    assert unfold.operands[0].dims == ("a0", None, "a2")
    assert [d.splittable for d in unfold.dims] == [True, False, True, False]
    assert move.operands[0].dims == ("a0", "a1", "a3", "a2")


@pytest.mark.skipif(importlib.util.find_spec("local_attention") is None, reason="local-attention (probe extra)")
def test_local_transformer_regions_carry_its_folds():
    """The probe set's LocalTransformer: each block's attention region is valid with its heads folded."""
    from tests.emit_workers import hf_models
    model, loss_fn = hf_models.build("lib:local_transformer", device="meta")
    x, y = hf_models.batch("lib:local_transformer", 2, 0)
    g = capture(model, x, loss_fn=loss_fn, target=y)
    attn = [r for r in tp_layout.regions(g, 2) if g.nodes[r.openers[0]].module.endswith("to_qkv")]
    assert len(attn) == 2 and all(not r.why and r.folds for r in attn), [r.why for r in attn]


def test_an_unmerge_of_features_is_no_free_move():
    """Only a merge into the data batch is a rank's own rows: [b, n, (h d)] viewed as [b, n, h, d] with
    the features split contiguously and the consumer splitting d (each rank half of every head) is
    priced as the all-to-all it is, not as free."""
    from sapp.costmodel.edges import edge_layouts

    class Heads(nn.Module):
        def forward(self, x):
            return x.view(x.shape[0], x.shape[1], 4, 8) * 2

    g = capture(Heads(), (torch.zeros(2, 8, 32, device="meta"),))
    view = next(n for n in g.nodes.values() if n.extra.get("folds"))
    op = view.operands[0]
    prod = g.nodes[op.producer] if op.producer else None
    if prod is None:                    # the view reads the input: make the producer layout by hand
        pytest.skip("the view reads the graph input directly")
    d_inner = view.out.dims[3]
    f_src, f_dst, _, _ = edge_layouts(prod, op, (prod.out.dims[2],), (d_inner,), view)
    assert f_src != f_dst, (f_src, f_dst)
