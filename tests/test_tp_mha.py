"""nn.MultiheadAttention under tensor parallelism (issue 51, finding 4b): the search planned the
attention module itself `colwise_gather` (its forward applies `in_proj_weight` and `out_proj.weight`
itself, so the graph saw two linears of module `attn`), the emitter splits only Linear, Embedding
and HF Conv1D layers, and `sapp run` refused the plan ("the emitted program differs from the plan").
Now a matmul whose weight is not its module's own `weight` is no linear tp may cut
(search/linears.own_weight), and the search's runnable check compares the layers the plan splits
with the ones the emitter can split, keeping any other replicated (sapp/runnable._unsplit_layers)."""
import json
import os
import subprocess
import sys

import torch
from torch import nn

D, SEQ, VOCAB, BATCH = 32, 8, 64, 4
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class MHABlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, 4, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x):
        h = self.ln(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.fc2(torch.relu(self.fc1(x)))


class MHANet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList([MHABlock() for _ in range(2)])
        self.head = nn.Linear(D, VOCAB)
        self.double()

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _search(tmp_path):
    from sapp.api import search
    from sapp.emit.runtime.program import default_loss
    from tests.emit_workers import custom_sp_run
    x, y = custom_sp_run._data(MHANet, 0)
    torch.manual_seed(0)
    plan = search(MHANet(), custom_sp_run.TP_CLUSTER, global_batch=BATCH, example_inputs=(x,), loss_fn=default_loss,
                  targets=y, constraints={"dp": 1, "tp": 2, "pp": 1, "zero": 0, "sp": False})
    path = os.path.join(tmp_path, "plan.json")
    plan.save(path)
    return plan, path, x


def test_mha_plan_runs_under_tp2_and_equals_one_process(tmp_path):
    from tests.emit_workers import custom_sp_run
    plan, path, _ = _search(tmp_path)
    styles = plan._d["tp_modules"]
    assert plan.parallel["tp"] == 2 and not any(n.endswith(".attn") for n in styles), styles
    assert styles.get("layers.0.fc1") == "colwise" and styles.get("layers.1.fc2") == "rowwise", styles
    out = os.path.join(tmp_path, "out.json")
    subprocess.run([sys.executable, "-m", "tests.emit_workers.custom_sp_run", f"{os.path.abspath(__file__)}:MHANet",
                    path, out], check=True, timeout=150, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    with open(out) as f:
        res = json.load(f)
    errs = [r["error"] for r in res["ranks"].values() if "error" in r]
    assert not errs and not res["failed"], (res["failed"], errs[:1])
    ref = custom_sp_run.single(MHANet)
    for r in res["ranks"].values():
        diff = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], ref))
        assert len(r["losses"]) == 3 and diff <= 1e-10, (diff, r["losses"], ref)


def test_runnable_check_gathers_a_module_the_emitter_cannot_split(tmp_path):
    """A plan naming the attention module (what the search wrote before) is caught at search: the
    module is kept replicated, in one line naming it and what the emitter splits."""
    from sapp.emit.runnable import check
    plan, _, x = _search(tmp_path)
    plan._d["tp_modules"]["layers.0.attn"] = "colwise_gather"
    rule, msg = check(MHANet(), plan, (x,))
    assert rule == ("gather", 2, ("layers.*.attn",)), rule
    assert "layers.0.attn (MultiheadAttention)" in msg and "\n" not in msg, msg
