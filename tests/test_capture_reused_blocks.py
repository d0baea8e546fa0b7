"""A container child called again after other blocks ran (HRM's L and H stacks alternating over their
cycles) is no pipeline cut point: the plan never lists it twice (hrm_text raised `PlanError: ...
lists 'model.L_module.layers.0', which stage 0 already holds`) and no stage boundary falls between
two uses of the same weights.  The emitter reads a stage's blocks by the same rule (a block the plan's
stages list nowhere is glue to it: emit/checks/stage_read.stage_candidates), so the pp=2 plan the
search writes runs on 2 gloo ranks and equals one process."""
import os
import sys

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


def _data(step):
    g = torch.Generator().manual_seed(5 + step)
    return (torch.randn(B, S, K, generator=g, dtype=torch.float64),
            torch.randn(B, S, K, generator=g, dtype=torch.float64))


def _build():
    torch.manual_seed(0)
    return Cycles().double()


def _train(path):
    from sapp.emit import emit
    from sapp.plan import Plan
    torch.set_num_threads(1)
    prog = emit(_build(), Plan.load(path), loss_fn=_loss, lr=1e-3, example_inputs=(_data(0)[0],),
                check_fingerprint=False)
    return {"losses": [prog.step(*prog.shard((_data(i)[0],), _data(i)[1])) for i in range(3)],
            "last": bool(prog.last_stage)}


def _rank(rank, world, cases, out_dir, store):
    from tests.emit_workers import harness
    harness.gloo_rank(rank, world, store, out_dir, lambda: _train(cases[0]))


def test_searched_pp2_plan_on_reused_blocks_runs(tmp_path):
    """A plan sapp writes, sapp runs: the manifest once read low.* / high.* as blocks of stage 1 the
    plan did not list ("stages: plan {'1': ['pre.1']}, emitted {'1': ['high.0', ...]}")."""
    from tests.emit_workers import harness
    x, y = _data(0)
    plan = search(_build(), "cpu:gpus=2", global_batch=B, example_inputs=(x,), loss_fn=_loss, targets=y,
                  constraints={"dp": 1, "tp": 1, "pp": 2})
    path = str(tmp_path / "p.json")
    plan.save(path)
    got = harness.spawn_cases("tests.test_capture_reused_blocks", [path], timeout=180)
    m = _build()
    opt, ref = torch.optim.Adam(m.parameters(), lr=1e-3), []
    for i in range(3):
        xi, yi = _data(i)
        loss = _loss(m(xi), yi)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref.append(loss.item())
    last = [r for r in got.values() if r["last"]]
    assert len(last) == 1 and max(abs(a - b) for a, b in zip(last[0]["losses"], ref)) <= 1e-12, (got, ref)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.emit_workers.harness import cases_main
    cases_main(_rank)
