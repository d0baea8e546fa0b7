"""A model that rebuilds a submodule in its forward and hands it its layers, under tensor parallelism
(issue 51; transformers' BigBird: BigBirdModel.forward switches block-sparse attention to full
attention at short sequences on its first call, `new = BigBirdSelfAttention(config); new.query =
self.self.query; ...`).  The shape audit captures the model with stand-ins of one rank's layer shapes
swapped in (sapp/emit/checks/rank_capture.swapped); the rebuild ran inside that capture, the new module
took the stand-ins along and kept them after the audit put the originals back on the old module: the
emitter then sharded a zero-weight stand-in already at a rank's width (tp2 step 0: "shape '[8, 16, 64]'
is invalid").  Now every place a stand-in went is given its layer back.  Here a small decoder of that
class trains at tp=2 on 2 gloo ranks equal to one process (3 Adam steps, float64)."""
import os

import torch
from torch import nn
from torch.nn import functional as F

D, HEADS, SEQ, VOCAB = 32, 4, 8, 64


class FullAttention(nn.Module):
    """Made from the shared config on the first call; reshapes by sizes of the whole model it stores."""

    def __init__(self, cfg):
        super().__init__()
        self.num_heads, self.head_size, self.all_head_size = cfg["heads"], cfg["dim"] // cfg["heads"], cfg["dim"]
        self.query = self.key = self.value = None

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, -1, self.head_size).transpose(1, 2) for f in (self.query, self.key, self.value))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).contiguous().view(b, t, self.all_head_size)


class SparseAttention(nn.Module):
    """The attention the model is built with (never run at these lengths)."""

    def __init__(self, cfg):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(cfg["dim"], cfg["dim"]) for _ in range(3))

    def forward(self, x):
        raise RuntimeError("sparse attention needs longer sequences")


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg, self.kind = cfg, "sparse"
        self.self = SparseAttention(cfg)
        self.dense = nn.Linear(cfg["dim"], cfg["dim"])

    def set_full(self):
        if self.kind == "full":
            return
        new = FullAttention(self.cfg)
        new.query, new.key, new.value = self.self.query, self.self.key, self.self.value
        self.self, self.kind = new, "full"

    def forward(self, x):
        return self.dense(self.self(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attention = Attention(cfg)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(torch.relu(self.fc1(self.ln2(x))))


class RebuildsAttention(nn.Module):
    def __init__(self):
        super().__init__()
        cfg = {"dim": D, "heads": HEADS}
        self.emb, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(SEQ, D)
        self.layers = nn.ModuleList([Block(cfg) for _ in range(2)])
        self.head = nn.Linear(D, VOCAB)
        self.double()

    def forward(self, ids):
        for layer in self.layers:       # BigBird: block-sparse is not possible at this length
            layer.attention.set_full()
        x = self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_attention_rebuilt_in_forward_splits_by_heads_and_equals_one_process(tmp_path):
    from sapp.api import search
    from sapp.emit.runtime.program import default_loss
    from tests.emit_workers import custom_sp_run
    x, y = custom_sp_run._data(RebuildsAttention, 0)
    with torch.device("meta"):
        meta = RebuildsAttention()
    plan = search(meta, custom_sp_run.TP_CLUSTER, global_batch=custom_sp_run.BATCH, example_inputs=(x,),
                  loss_fn=default_loss, targets=y, constraints={"dp": 1, "tp": 2, "pp": 1, "zero": 0, "sp": False})
    styles = plan._d["tp_modules"]
    assert [styles.get(f"layers.0.attention.self.{p}") for p in ("query", "key", "value")] == ["colwise"] * 3, styles
    assert styles.get("layers.1.attention.dense") == "rowwise", styles
    path = os.path.join(tmp_path, "plan.json")
    plan.save(path)
    ref = custom_sp_run.single(RebuildsAttention)
    ranks = custom_sp_run.launch(f"{os.path.abspath(__file__)}:RebuildsAttention", path, tmp_path, timeout=150)
    for rank, res in sorted(ranks.items()):
        diff = max(abs(a - b) / abs(b) for a, b in zip(res["losses"], ref))
        assert len(res["losses"]) == 3 and diff <= 1e-10, (rank, diff, res["losses"], ref)


def test_swapped_gives_a_rebuilt_module_its_layer_back():
    from sapp.emit.checks.rank_capture import swapped
    model = RebuildsAttention()
    real = model.layers[0].attention.self.query
    stand_in = nn.Linear(D, D // 2).double()
    with swapped(model, {"layers.0.attention.self.query": stand_in}):
        model.layers[0].attention.set_full()
        assert model.layers[0].attention.self.query is stand_in
    assert model.layers[0].attention.self.query is real
