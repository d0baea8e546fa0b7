"""A module reachable by two paths is one module: performer-pytorch keeps its layers under `net` and
again under `proj_updater.instance`, and the emitter called every weight there "tied" and ran the
searched tp regions replicated, so `sapp run` refused every tp2 plan the search wrote for a Performer.
Two module objects sharing one weight are still a tie, and their region still runs replicated."""
from torch import nn

from sapp.emit.tp import parallel


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.w2(self.w1(x).relu())


class Aliased(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.ModuleList([MLP()])

        class Holder(nn.Module):
            pass
        self.updater = Holder()
        self.updater.instance = self.net          # the same layers again, under another path


STYLES = {"net.0.w1": "colwise", "net.0.w2": "rowwise"}
GROUPS = [["net.0.w1", "net.0.w2"]]


def _derived(model):
    notes = []
    plan = parallel._derived_styles(model, dict(model.named_modules()), STYLES, GROUPS, None, notes, dry=True)
    return plan, notes


def test_one_module_under_two_paths_is_sharded():
    plan, notes = _derived(Aliased())
    assert plan == STYLES and not notes


def test_two_modules_sharing_a_weight_still_run_replicated():
    m = Aliased()
    m.other = nn.Linear(8, 32)
    m.other.weight = m.net[0].w1.weight            # a real tie: another module object holds the weight
    plan, notes = _derived(m)
    assert plan == {} and "tied to another module" in notes[0]


class Stack(nn.Module):
    """Two blocks, registered again under a second path that forward reads (Performer's
    proj_updater.instance): torch.export's split needs one parent per module."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([MLP(), MLP()])

        class Updater(nn.Module):
            pass
        self.updater = Updater()
        self.updater.instance = self.layers

    def forward(self, x):
        for layer in self.updater.instance if self.training else self.layers:
            x = x + layer(x)
        return x


def test_a_pipeline_splits_a_model_with_aliased_modules_and_leaves_it_as_it_was():
    import torch
    from sapp.emit.pp import pipe
    torch.manual_seed(0)
    m = Stack()
    before = [(n, id(mod)) for n, mod in m.named_modules(remove_duplicate=False)]
    x = torch.randn(4, 8)
    want = m(x)
    split = pipe.trace(m, (x,), ["layers.1"])
    assert split.num_stages == 2
    got = split.split_gm.submod_pp_1(split.split_gm.submod_pp_0(x))
    assert torch.allclose(got, want)
    assert [(n, id(mod)) for n, mod in m.named_modules(remove_duplicate=False)] == before
    assert m.updater.instance is m.layers and "instance" in m.updater._modules



def test_a_pipeline_splits_performer_inside_its_layer_lists():
    """performer-pytorch's LM (its layers under `net` and again under `proj_updater.instance`) split before
    `layers.1.0`, inside a layer's [attention, feed-forward] list: torch's split fails there with "Attribute
    'norm' not found in model", not the two-parents message the retry used to wait for, and pp2 of both
    Performers was refused (bench/lib_catalogue.py; now equal to one process)."""
    import pytest
    import torch
    pytest.importorskip("performer_pytorch")
    from sapp.emit.pp import pipe
    from tests.emit_workers import lib_models as L
    torch.manual_seed(0)
    m = L._performer(True)().eval()
    ids = torch.randint(0, L.VOCAB, (2, L.SEQ))
    want = m(ids)
    split = pipe.trace(m, (ids,), ["performer.net.layers.1.0"])
    assert split.num_stages == 2
    assert torch.allclose(split.split_gm.submod_pp_1(split.split_gm.submod_pp_0(ids)), want, atol=1e-6)
    assert m.performer.proj_updater.instance is m.performer.net
