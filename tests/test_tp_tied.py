"""A weight tied between an embedding and its output head under tensor parallelism
(sapp/emit/tp/parallel.py): split by vocabulary in both uses it stays one parameter; a layout that
splits one use alone runs it replicated, with a note (split alone, the two uses would step apart).
In one process (a world-1 gloo group: DTensor's layouts on a mesh of one)."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from sapp.emit.tp import parallel


class TiedLM(nn.Module):
    def __init__(self, v=16, h=8):
        super().__init__()
        self.emb = nn.Embedding(v, h)
        self.mid = nn.Linear(h, h)
        self.head = nn.Linear(h, v, bias=False)
        self.head.weight = self.emb.weight
        # an uncalled holder of the same weight (BART's `shared` table beside its embeddings)
        self.shared = nn.Embedding(v, h)
        self.shared.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mid(self.emb(ids))))


@pytest.fixture
def mesh(tmp_path):
    """A tp mesh of one over a world-1 gloo group."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield parallel.build_mesh(torch.device("cpu"), 1, 1, 1)["tp"]
    finally:
        dist.destroy_process_group()


def test_both_uses_split_stay_one_weight(mesh):
    # hand-written: every Linear / Embedding holding the weight named; searched: the uses the graph
    # has, the uncalled holder re-tied
    for styles, groups in (({"emb": "vocab", "head": "colwise_gather", "shared": "vocab"}, None),
                           ({"emb": "vocab", "head": "colwise_gather"}, [["emb"], ["head"]])):
        m, notes = TiedLM(), []
        done = parallel.apply_tp(m, styles, mesh, notes, groups=groups)
        assert done == sorted(styles), notes
        assert m.head.weight is m.emb.weight is m.shared.weight and hasattr(m.emb.weight, "placements")
        assert [n for n, _ in m.named_parameters()] == ["emb.weight", "mid.weight", "mid.bias"]
        m(torch.tensor([[1, 2, 3]])).sum().backward()
        assert m.emb.weight.grad is not None           # both uses' gradients in the one weight


def test_one_use_split_alone_runs_replicated_with_a_note(mesh):
    # hand-written: only the head named; searched: both named, the embedding's group not split here
    for styles, groups in (({"head": "colwise_gather"}, None),
                           ({"emb": "vocab", "head": "colwise_gather"}, [["head"]])):
        m, notes = TiedLM(), []
        done = parallel.apply_tp(m, styles, mesh, notes, groups=groups)
        assert done == [] and m.head.weight is m.emb.weight and not hasattr(m.emb.weight, "placements")
        assert any("head" in n and "tied" in n for n in notes), notes
