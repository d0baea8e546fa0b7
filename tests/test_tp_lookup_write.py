"""An Embedding whose own forward writes into the rows it looked up, under tensor parallelism (issue
51; transformers' T5Gemma2: `rows[ids == eoi] = self.eoi_embedding` in T5Gemma2TextScaledWordEmbedding).
Split by vocabulary, the lookup is a tensor summed over tp (a Partial DTensor) until the module's output:
the write put a replicated value into it, and DTensor refused the backward at step 0 ("aten.index_put
got mixed torch.Tensor and DTensor").  The search now keeps such a table replicated (search/linears.
lookup_tail, one line in the layout's notes naming the op) and tp on the rest; a table whose forward only
scales its rows (Gemma's embed_scale) is still split.  tp=2 on 2 gloo ranks, 3 Adam steps in float64,
equal to one process."""
import os

import pytest
import torch
from torch import nn

D, SEQ, VOCAB, EOI = 32, 8, 256, 24      # EOI: a token of the first batch


class WritingEmbedding(nn.Embedding):
    def __init__(self, n, d, write=True):
        super().__init__(n, d)
        self.write = write
        self.embed_scale = nn.Buffer(torch.tensor(d ** 0.5), persistent=False)
        self.eoi_embedding = nn.Parameter(torch.randn(d))

    def forward(self, ids):
        rows = super().forward(ids) * self.embed_scale.to(self.weight.dtype)
        if self.write:
            rows[ids == EOI] = self.eoi_embedding.to(rows.dtype)
        return rows


class Net(nn.Module):
    WRITE = True

    def __init__(self):
        super().__init__()
        self.emb = WritingEmbedding(VOCAB, D, self.WRITE)
        self.ln = nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.emb.weight          # tied, as T5Gemma2's lm_head and its tables
        self.double()

    def forward(self, ids):
        x = self.emb(ids)
        x = x + self.fc2(torch.relu(self.fc1(self.ln(x))))
        return self.head(x)


class ScalingNet(Net):
    WRITE = False


def _search(cls):
    from sapp.api import search
    from sapp.emit.runtime.program import default_loss
    from tests.emit_workers import custom_sp_run
    x, y = custom_sp_run._data(cls, 0)
    with torch.device("meta"):
        meta = cls()
    return search(meta, custom_sp_run.TP_CLUSTER, global_batch=custom_sp_run.BATCH, example_inputs=(x,),
                  loss_fn=default_loss, targets=y, constraints={"dp": 1, "tp": 2, "pp": 1, "zero": 0, "sp": False})


def test_layout_keeps_a_writing_table_replicated_and_says_why():
    from sapp.capture import capture
    from sapp.emit.runtime.program import default_loss
    from sapp.search import tp_layout
    from tests.emit_workers import custom_sp_run
    for cls, why in ((Net, "aten.index_put"), (ScalingNet, "")):
        x, y = custom_sp_run._data(cls, 0)
        g = capture(cls(), (x,), loss_fn=default_loss, target=y)
        emb = next(n for n, node in g.nodes.items() if node.kind == "embedding")
        strategies, _, notes = tp_layout.emittable(g, {emb: "v"}, 2)
        lines = [n for n in notes if n.startswith("tp layout: emb stays replicated")]
        if why:
            assert strategies[emb] is None and len(lines) == 1 and why in lines[0] and "\n" not in lines[0], notes
        else:
            assert strategies[emb] == "v" and not lines, (strategies[emb], notes)


@pytest.mark.parametrize("cls", [Net, ScalingNet])
def test_tp2_plan_runs_and_equals_one_process(cls, tmp_path):
    from tests.emit_workers import custom_sp_run
    plan = _search(cls)
    styles = plan._d["tp_modules"]
    assert plan.parallel["tp"] == 2 and styles.get("fc1") == "colwise" and styles.get("fc2") == "rowwise", styles
    assert ("emb" in styles) is (cls is ScalingNet), styles          # a scaling table is still split
    x, _ = custom_sp_run._data(cls, 0)
    assert (x == EOI).any()                  # the write happens in the data trained on
    path = os.path.join(tmp_path, "plan.json")
    plan.save(path)
    ref = custom_sp_run.single(cls)
    ranks = custom_sp_run.launch(f"{os.path.abspath(__file__)}:{cls.__name__}", path, tmp_path, timeout=150)
    for rank, res in sorted(ranks.items()):
        diff = max(abs(a - b) / abs(b) for a, b in zip(res["losses"], ref))
        assert len(res["losses"]) == 3 and diff <= 1e-10, (rank, diff, res["losses"], ref)
