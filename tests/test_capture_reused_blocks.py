"""A container child called again after other blocks ran (HRM's L and H stacks alternating over their
cycles) is no pipeline cut point: the plan never lists it twice (hrm_text raised `PlanError: ...
lists 'model.L_module.layers.0', which stage 0 already holds`) and no stage boundary falls between
two uses of the same weights."""
import torch

from sapp.api import capture_graph, search
from sapp.pipeline.units import split_units

B, S, K = 4, 6, 16


class Cycles(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = torch.nn.ModuleList(torch.nn.Linear(K, K) for _ in range(2))   # called once each
        self.low = torch.nn.ModuleList(torch.nn.Linear(K, K) for _ in range(2))
        self.high = torch.nn.ModuleList(torch.nn.Linear(K, K) for _ in range(2))

    def forward(self, x):
        for b in self.pre:
            x = torch.relu(b(x))
        for _ in range(2):                      # low, low, high, low, low, high
            for b in self.low:
                x = torch.relu(b(x))
            for b in self.high:
                x = torch.relu(b(x))
        return x


def _loss(out, y):
    return torch.nn.functional.mse_loss(out, y)


def test_reused_blocks_are_one_region_without_cuts():
    m, x, y = Cycles(), torch.randn(B, S, K), torch.randn(B, S, K)
    g, _ = capture_graph(m, (x,), _loss, y)
    units = split_units(g)
    blocks = [u.name for u in units if u.kind == "block"]
    assert blocks == ["pre.0", "pre.1"]                         # low.* / high.* never start a stage
    region = [u for u in units if u.kind == "glue" and any(g.nodes[n].module.startswith("low.") for n in u.nodes)]
    assert len(region) == 1                                     # every call of low.* and high.* in one unit
    mods = {g.nodes[n].module.split(".")[0] for n in region[0].nodes if g.nodes[n].module}
    assert {"low", "high"} <= mods and "pre" not in mods
    assert sum(len(u.nodes) for u in units) == len(g.nodes)    # nothing lost or doubled


def test_search_on_reused_blocks_lists_each_block_once(tmp_path):
    import json
    m, x, y = Cycles(), torch.randn(B, S, K), torch.randn(B, S, K)
    g, _ = capture_graph(m, (x,), _loss, y)
    for pp in (1, 2):
        plan = search(m, "cpu:gpus=2", global_batch=B, example_inputs=(x,), loss_fn=_loss, targets=y, graph=g,
                      constraints={"dp": 2 // pp, "tp": 1, "pp": pp})
        plan.save(str(tmp_path / "p.json"))
        stages = json.loads((tmp_path / "p.json").read_text())["pipeline"].get("stages") or []
        listed = [b for st in stages for b in st.get("blocks") or []]
        assert len(listed) == len(set(listed)) and not any(b.startswith(("low.", "high.")) for b in listed)
        if pp == 2:                              # the cut can only fall between pre.0 and pre.1
            assert [st.get("blocks") for st in stages] == [["pre.0"], ["pre.1"]], stages
