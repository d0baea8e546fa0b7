"""nn.MultiheadAttention under tensor parallelism (issue 51, finding 4b).  The module applies its packed
`in_proj_weight` and `out_proj.weight` in its own forward, so no Linear of it is a layer DTensor's styles
can split.  The search now recognises the module's in-projection, SDPA and out-projection on the graph
(sapp/search/tp_mha.py) and plans it `tp_modules[M] = "heads"`; the emitter runs its forward over a
rank's heads (sapp/emit/tp/mha.py).  Here: a 2-block MHA decoder at tp=2 on 2 gloo ranks trains equal
to one process in float64 (3 Adam steps), its checkpoint holds the model's own rows (read alone with
DCP at tp=1 it equals one process's weights) and resumes to one process's next loss; under sequence
parallelism the module is not split by heads; an MHA that cannot be split (kdim != embed_dim, or
cross-attention over another input) stays replicated with one line saying why, and a hand-written
plan that splits it anyway is gathered by the search's runnable check in one line."""
import os
import sys

import pytest
import torch
from torch import nn

D, SEQ, VOCAB, BATCH = 32, 8, 64, 4
STEPS = 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


class MHABlock(nn.Module):
    def __init__(self, kind="self"):
        super().__init__()
        self.kind = kind
        self.ln = nn.LayerNorm(D)
        kv = D // 2 if kind == "kdim" else D
        self.attn = nn.MultiheadAttention(D, 4, batch_first=True, **({"kdim": kv, "vdim": kv} if kind == "kdim" else {}))
        self.mem = nn.Linear(D, kv) if kind != "self" else None     # keys / values from another input
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x):
        h = self.ln(x)
        m = h if self.mem is None else self.mem(x)
        x = x + self.attn(h, m, m, need_weights=False)[0]
        return x + self.fc2(torch.relu(self.fc1(x)))


class MHANet(nn.Module):
    KIND = "self"

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList([MHABlock(self.KIND) for _ in range(2)])
        self.head = nn.Linear(D, VOCAB)
        self.double()

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class KdimNet(MHANet):
    KIND = "kdim"


class CrossNet(MHANet):
    KIND = "cross"


def _search(cls, tmp_path, sp=False):
    from sapp.api import search
    from sapp.emit.runtime.program import default_loss
    from tests.emit_workers import custom_sp_run
    x, y = custom_sp_run._data(cls, 0)
    torch.manual_seed(0)
    plan = search(cls(), custom_sp_run.TP_CLUSTER, global_batch=BATCH, example_inputs=(x,), loss_fn=default_loss,
                  targets=y, constraints={"dp": 1, "tp": 2, "pp": 1, "zero": 0, "sp": sp})
    path = os.path.join(tmp_path, f"plan-{cls.__name__}-{int(sp)}.json")
    plan.save(path)
    return plan, path, x


def _reference(steps):
    """One process's losses and model after `steps` Adam steps (float64), as custom_sp_run trains."""
    from sapp.emit.runtime.program import default_loss
    from tests.emit_workers import custom_sp_run
    torch.manual_seed(0)
    m = MHANet()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    losses = []
    for i in range(steps):
        x, y = custom_sp_run._data(MHANet, i)
        opt.zero_grad()
        loss = default_loss(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, m


def _rank(rank, world, cases, out_dir, store):
    from tests.emit_workers import harness
    harness.gloo_rank(rank, world, store, out_dir, lambda: _train(cases[0]["plan"], cases[0]["ckpt"], world))


def _train(plan_path, ckpt, world):
    from sapp.emit import emit
    from sapp.emit.runtime.checkpoint import Checkpointer
    from sapp.emit.runtime.train_state import model_names
    from sapp.plan import Plan
    from tests.emit_workers import custom_sp_run
    cls = sys.modules[__name__].MHANet
    x0, _ = custom_sp_run._data(cls, 0)
    torch.manual_seed(0)
    model = cls()
    prog = emit(model, Plan.load(plan_path), lr=1e-3, example_inputs=(x0,), check_fingerprint=False)
    losses = [prog.step(*prog.shard(*_xy(cls, i))) for i in range(STEPS)]
    w = model.layers[0].attn.in_proj_weight
    out = {"losses": losses, "heads_local": list(w.to_local().shape) if hasattr(w, "to_local") else None,
           "fused": sorted(prog.fused_params)}
    ck = Checkpointer(ckpt, keep=1, names=model_names(model), world=world)
    out["checkpoint"] = ck.save(prog, STEPS, {"global_batch": BATCH})
    torch.manual_seed(1)                    # other initial weights: all of them must come from the file
    again = cls()
    prog2 = emit(again, Plan.load(plan_path), lr=1e-3, example_inputs=(x0,), check_fingerprint=False)
    torch.manual_seed(0)
    Checkpointer(ckpt, names=model_names(cls()), world=world).load(prog2, out["checkpoint"])
    out["resumed_loss"] = prog2.step(*prog2.shard(*_xy(cls, STEPS)))
    return out


def _xy(cls, step):
    from tests.emit_workers import custom_sp_run
    x, y = custom_sp_run._data(cls, step)
    return (x,), y


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from tests.emit_workers import harness
    tmp = tmp_path_factory.mktemp("tp_mha")
    plan, path, _ = _search(MHANet, tmp)
    got = harness.spawn_cases("tests.test_tp_mha", [{"plan": path, "ckpt": str(tmp / "ckpt")}], timeout=300)
    return plan, got


def test_mha_split_by_heads_under_tp2_equals_one_process(trained):
    plan, got = trained
    styles = plan._d["tp_modules"]
    assert plan.parallel["tp"] == 2 and [styles.get(f"layers.{i}.attn") for i in (0, 1)] == ["heads", "heads"], styles
    assert styles.get("layers.0.fc1") == "colwise" and styles.get("layers.1.fc2") == "rowwise", styles
    ref, _ = _reference(STEPS)
    for r, res in got.items():
        assert res["heads_local"] == [3 * D // 2, D], (r, res["heads_local"])     # q, k, v of 2 of 4 heads
        assert "layers.0.attn.in_proj_weight" in res["fused"], (r, res["fused"])
        diff = max(abs(a - b) / abs(b) for a, b in zip(res["losses"], ref))
        assert len(res["losses"]) == STEPS and diff <= 1e-10, (r, diff, res["losses"], ref)


def test_mha_checkpoint_holds_the_model_rows_and_resumes(trained):
    """Written at tp=2 (in_proj's rows in rank order inside the DTensor), read at tp=1 with DCP alone:
    every weight equals one process's after the same steps; resumed at tp=2, the next loss is one
    process's."""
    import torch.distributed.checkpoint as dcp
    _, got = trained
    ref, _ = _reference(STEPS + 1)
    _, at = _reference(STEPS)
    state = {f"model.{k}": torch.zeros_like(v) for k, v in at.state_dict().items()}
    dcp.load(state, checkpoint_id=got["0"]["checkpoint"], no_dist=True)
    for k, v in at.state_dict().items():
        assert torch.allclose(state[f"model.{k}"], v, rtol=0, atol=1e-12), k
    for r, res in got.items():
        assert abs(res["resumed_loss"] - ref[STEPS]) <= 1e-10 * abs(ref[STEPS]), (r, res["resumed_loss"], ref)


def test_mha_under_sequence_parallelism_is_not_split_by_heads(tmp_path):
    """The heads forward gathers no sequence: with SP pinned the search either drops SP (saying so) and
    splits the heads, or keeps SP and leaves the module replicated; the plan it writes runs."""
    from sapp.capture import capture
    from sapp.emit.runtime.program import default_loss
    from sapp.search.tp_layout import regions
    from tests.emit_workers import custom_sp_run
    plan, path, x = _search(MHANet, tmp_path, sp=True)
    heads = [n for n, s in plan._d["tp_modules"].items() if s == "heads"]
    if plan.parallel.get("sp"):
        assert not heads, plan._d["tp_modules"]
    else:
        assert any(n.startswith("sequence parallelism was pinned") for n in plan._d["notes"]), plan._d["notes"]
    _, y = custom_sp_run._data(MHANet, 0)
    graph = capture(MHANet(), (x,), loss_fn=default_loss, target=y)
    whys = [r.why for r in regions(graph, 2, mha=False) if graph.nodes[r.openers[0]].module == "layers.0.attn"]
    assert whys and "without sequence parallelism only" in whys[0], whys
    ref = custom_sp_run.single(MHANet)
    for r, res in custom_sp_run.launch(f"{os.path.abspath(__file__)}:MHANet", path, tmp_path, timeout=150).items():
        diff = max(abs(a - b) / abs(b) for a, b in zip(res["losses"], ref))
        assert len(res["losses"]) == STEPS and diff <= 1e-10, (r, diff, res["losses"], ref)


@pytest.mark.parametrize("cls,why", [(KdimNet, "separate q/k/v projection weights"),
                                     (CrossNet, "applies slices of its in_proj_weight")])
def test_mha_that_cannot_be_split_stays_replicated_says_why(cls, why, tmp_path):
    from sapp.capture import capture
    from sapp.emit.runtime.program import default_loss
    from sapp.search.tp_mha import regions
    from sapp.search.tp_layout import Region
    from tests.emit_workers import custom_sp_run
    plan, _, x = _search(cls, tmp_path)
    assert not any(n.endswith(".attn") for n in plan._d["tp_modules"]), plan._d["tp_modules"]
    _, y = custom_sp_run._data(cls, 0)
    graph = capture(cls(), (x,), loss_fn=default_loss, target=y)
    lines = [r.why for r in regions(graph, 2, Region)]
    assert len(lines) == 2 and all(why in w and "\n" not in w for w in lines), lines


def test_runnable_check_gathers_a_module_the_emitter_cannot_split(tmp_path):
    """A plan naming the attention module by a Linear's style (what the search wrote before), or 'heads'
    on one whose q/k/v weights are separate, is caught at search: kept replicated, one line naming it."""
    from sapp.emit.runnable import check
    plan, _, x = _search(MHANet, tmp_path)
    plan._d["tp_modules"]["layers.0.attn"] = "colwise_gather"
    rule, msg = check(MHANet(), plan, (x,))
    assert rule == ("gather", 2, ("layers.*.attn",)), rule
    assert "layers.0.attn (MultiheadAttention)" in msg and "\n" not in msg, msg
    plan, _, x = _search(KdimNet, tmp_path)
    plan._d["tp_modules"]["layers.0.attn"] = "heads"
    rule, msg = check(KdimNet(), plan, (x,))
    assert rule == ("gather", 2, ("layers.*.attn",)), rule
    assert "splits layers.0.attn by heads" in msg and "separate q/k/v" in msg and "\n" not in msg, msg


if __name__ == "__main__":
    from tests.emit_workers import harness
    harness.cases_main(_rank)
