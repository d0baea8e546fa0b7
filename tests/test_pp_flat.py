"""Models without containers under pp=2 (issue 51, finding 4a): a flat CNN (its layers the root's own
children) and an LSTM language model.  The search cuts their stages at the modules that start a key
operator (pipeline/units.split_units); the emitter's manifest named a stage's blocks only by the
children of the model's containers, found none, and `sapp run` refused the plan the search wrote
("stages: plan {'0': ['c1', 'c2', 'prologue']}, emitted {'0': []}").  Now the manifest reads a flat
model's stages by the search's units (manifest.stage_candidates) and the search's runnable check
compares the traced stages with the plan's listing.  2 gloo processes, float64, against one process."""
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
BATCH, STEPS, D, VOCAB, SEQ = 4, 3, 16, 32, 6


class FlatCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.r1 = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()
        self.c2, self.r2 = nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()
        self.c3, self.r3 = nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()
        self.pool, self.flat, self.fc = nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)

    def forward(self, x):
        x = self.r2(self.c2(self.r1(self.c1(x))))
        return self.fc(self.flat(self.pool(self.r3(self.c3(x)))))


class LSTMLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.lstm = nn.LSTM(D, D, num_layers=2, batch_first=True)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids):
        return self.head(self.lstm(self.emb(ids))[0]).flatten(0, 1)


MODELS = {"cnn": FlatCNN, "lstm": LSTMLM}


def build(kind):
    torch.manual_seed(0)
    return MODELS[kind]().double()


def data(kind, step):
    g = torch.Generator().manual_seed(70 + step)
    if kind == "cnn":
        return torch.randn(BATCH, 3, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 10, (BATCH,), generator=g)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return ids[:, :-1], ids[:, 1:].reshape(-1)


def loss_fn(out, y):
    return nn.functional.cross_entropy(out, y)


def reference(kind):
    m = build(kind)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    losses = []
    for i in range(STEPS):
        x, y = data(kind, i)
        loss = loss_fn(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _rank(rank, world, cases, out_dir, store):
    from tests.emit_workers import harness
    harness.gloo_rank(rank, world, store, out_dir, lambda: {kind: _run(kind, path) for kind, path in cases})


def _run(kind, path) -> dict:
    from sapp.emit import emit
    from sapp.plan import Plan
    prog = emit(build(kind), Plan.load(path), loss_fn=loss_fn, lr=1e-3, example_inputs=(data(kind, 0)[0],),
                check_fingerprint=False)
    return {"losses": [prog.step(*prog.shard((data(kind, i)[0],), data(kind, i)[1])) for i in range(STEPS)],
            "last": bool(prog.last_stage)}


@pytest.fixture(scope="module")
def per_rank(tmp_path_factory):
    from sapp.api import search
    tmp = tmp_path_factory.mktemp("pp_flat")
    cases, plans = [], {}
    for kind in MODELS:
        x, y = data(kind, 0)
        plan = search(build(kind), "cpu:gpus=2", global_batch=BATCH, example_inputs=(x,), loss_fn=loss_fn, targets=y,
                      constraints={"dp": 1, "tp": 1, "pp": 2, "zero": 0, "micro_batches": 2})
        assert plan.parallel["pp"] == 2, plan.parallel
        path = str(tmp / f"{kind}.json")
        plan.save(path)
        cases.append((kind, path))
        plans[kind] = plan
    with open(tmp / "cases.json", "w") as f:
        json.dump(cases, f)
    out = str(tmp / "out.json")
    subprocess.run([sys.executable, "-m", "tests.test_pp_flat", str(tmp / "cases.json"), out], cwd=ROOT,
                   timeout=180, check=False, env=dict(os.environ, PYTHONPATH=ROOT))
    with open(out) as f:
        got = json.load(f)
    for g in got.values():
        assert "error" not in g, g["error"]
    return got, plans


@pytest.mark.parametrize("kind", list(MODELS))
def test_flat_model_under_pp2_runs_and_equals_one_process(per_rank, kind):
    got, plans = per_rank
    stages = plans[kind].pipeline["stages"]
    assert len(stages) == 2 and all(s["blocks"] for s in stages), stages
    ref = reference(kind)
    last = [g[kind] for g in got.values() if g[kind]["last"]]
    assert len(last) == 1, got
    diff = max(abs(a - b) for a, b in zip(last[0]["losses"], ref))
    assert len(last[0]["losses"]) == STEPS and diff <= 1e-12, (diff, last[0]["losses"], ref)


if __name__ == "__main__":
    from tests.emit_workers.harness import cases_main
    cases_main(_rank)
