"""Bring your own model: `pkg.module:factory` and HF config specs through sapp.search, the CLI and
`sapp run` (2 gloo processes), and the one-line errors for specs that cannot give a model."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import sapp
from sapp.api import search
from sapp.errors import SappError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAPP = [sys.executable, "-m", "sapp.commands.cli"]

FACTORY = textwrap.dedent('''
    import torch
    from torch import nn
    from torch.nn import functional as F


    class Net(nn.Module):
        def __init__(self, width=16):
            super().__init__()
            self.fc1 = nn.Linear(8, width)
            self.fc2 = nn.Linear(width, 4)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))


    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            if x.sum() > 0:               # data-dependent control flow: not capturable
                return self.fc(x)
            return x


    def build(width=16):
        g = torch.Generator().manual_seed(5)
        x = torch.randn(4, 8, generator=g).to(torch.get_default_device())
        y = torch.randint(0, 4, (4,), generator=g).to(torch.get_default_device())
        return Net(width), (x,), y, F.cross_entropy


    def no_loss():
        return Net(), torch.zeros(2, 8)


    def bare():
        return Net()


    def broken():
        raise RuntimeError("checkpoint shard 3 missing")


    def gate():
        return Gate(), (torch.ones(4, 8),), torch.ones(4, 8), F.mse_loss
''')


@pytest.fixture()
def pkg(tmp_path, monkeypatch):
    d = tmp_path / "mypkg"
    d.mkdir()
    (d / "__init__.py").write_text("")
    (d / "mymodel.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in [m for m in sys.modules if m.startswith("mypkg")]:
        del sys.modules[m]
    return tmp_path


def _sapp(*args, cwd=ROOT, pythonpath=(), timeout=150):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *map(str, pythonpath)]))
    return subprocess.run(SAPP + list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def test_factory_bundle_is_searched_with_its_loss(pkg):
    plan = search("mypkg.mymodel:build", "cpu:gpus=2", global_batch=8, constraints={"dp": 2})
    assert plan.model["name"] == "mypkg.mymodel:build"
    assert plan.model["params"] == 8 * 16 + 16 + 16 * 4 + 4
    kinds = [o["kind"] for o in plan.operators.values()]
    assert kinds.count("matmul") == 2 and "loss" in kinds
    # a factory without targets/loss gives a graph without a loss
    p2 = search("mypkg.mymodel:no_loss", "cpu:gpus=2", global_batch=8, constraints={"dp": 2})
    assert "loss" not in [o["kind"] for o in p2.operators.values()]


def test_search_api_takes_loss_fn_and_targets():
    from torch import nn
    from torch.nn import functional as F
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
    with_loss = search(m, "cpu:gpus=1", global_batch=8, example_inputs=(x,), loss_fn=F.cross_entropy, targets=y)
    without = search(m, "cpu:gpus=1", global_batch=8, example_inputs=(x,))
    assert [o["kind"] for o in with_loss.operators.values()].count("loss") == 1
    assert "loss" not in [o["kind"] for o in without.operators.values()]
    with pytest.raises(SappError, match="together"):
        search(m, "cpu:gpus=1", global_batch=8, example_inputs=(x,), loss_fn=F.cross_entropy)


@pytest.mark.parametrize("spec, words", [
    ("mypkg.mymodel:broken", ["factory mypkg.mymodel:broken raised RuntimeError", "checkpoint shard 3 missing"]),
    ("mypkg.mymodel:bare", ["cannot guess its inputs", "(module, example_inputs, targets, loss_fn)"]),
    ("mypkg.mymodel:nothere", ["has no 'nothere'"]),
    ("mypkg.nomodule:build", ["cannot import", "PYTHONPATH"]),
])
def test_bad_factory_is_one_line(pkg, spec, words):
    with pytest.raises(SappError) as e:
        search(spec, "cpu:gpus=1", global_batch=8)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_uncapturable_factory_model_is_one_line(pkg):
    with pytest.raises(sapp.CaptureError) as e:
        search("mypkg.mymodel:gate", "cpu:gpus=1", global_batch=8)
    msg = str(e.value)
    assert "\n" not in msg and "Gate" in msg and "control flow" in msg


def test_unsupported_hf_architecture_is_one_line(tmp_path):
    pytest.importorskip("transformers")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model_type": "no_such_arch", "hidden_size": 8}))
    with pytest.raises(SappError) as e:
        search(str(bad), "cpu:gpus=1", global_batch=8)
    assert "\n" not in str(e.value) and "no_such_arch" in str(e.value) and "pkg.module:factory" in str(e.value)
    # known to transformers, but no trainable head sapp knows how to feed
    enc = tmp_path / "clip.json"
    enc.write_text(json.dumps({"model_type": "clip_text_model", "hidden_size": 32, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "intermediate_size": 64}))
    with pytest.raises(SappError) as e:
        search(str(enc), "cpu:gpus=1", global_batch=8)
    assert "\n" not in str(e.value) and "clip_text_model" in str(e.value)
    with pytest.raises(SappError, match="not found"):
        search(str(tmp_path / "missing.json"), "cpu:gpus=1", global_batch=8)


def test_cli_search_hf_config(capsys, monkeypatch):
    """In-process: a fresh interpreter per command only paid for importing torch."""
    pytest.importorskip("transformers")
    from sapp.commands.cli import main
    monkeypatch.chdir(ROOT)
    rc = main(["search", "--hf-config", "tests/data/llama.json", "--cluster", "h100-80g:nodes=1", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err[-2000:]
    plan = json.loads(out)
    assert plan["model"]["name"] == "tests/data/llama.json" and plan["devices"] == 8
    assert plan["model"]["meta"]["unknown_ops"] == []
    # 2 layers x (q, k, v, o, gate, up, down) + lm_head, all priced as GEMMs
    assert sum(1 for o in plan["operators"].values() if o["kind"] == "matmul") == 2 * 7 + 1
    rc = main(["search", "--model", "gpt-tiny", "--hf-config", "tests/data/llama.json", "--cluster", "cpu"])
    assert rc != 0 and "not both" in capsys.readouterr().err


def test_cli_run_factory_model_two_processes(tmp_path):
    d = tmp_path / "mypkg"
    d.mkdir()
    (d / "__init__.py").write_text("")
    (d / "mymodel.py").write_text(FACTORY)
    plan = tmp_path / "plan.json"
    p = _sapp("search", "--model", "mypkg.mymodel:build", "--cluster", "cpu:gpus=2", "--dp", "2", "--batch", "8",
              "--out", str(plan), cwd=tmp_path, pythonpath=[tmp_path])
    assert p.returncode == 0, p.stderr[-2000:]
    out = tmp_path / "r.json"
    r = _sapp("run", str(plan), "--model", "mypkg.mymodel:build", "--steps", "4", "--out", str(out),
              "--log-json", str(tmp_path / "log.jsonl"), cwd=tmp_path, pythonpath=[tmp_path], timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["devices"] == 2 and res["parallel"]["dp"] == 2 and len(res["losses"]) == 4
    logs = [[r for r in map(json.loads, (tmp_path / name).read_text().splitlines()) if "event" not in r]
            for name in ("log.jsonl", "log.rank1.jsonl")]           # steps only (rank 0's opens with its start event)
    for i in range(4):
        assert f"[rank 0] step {i} loss {res['losses'][i]:.6f}" in r.stdout      # rank 0 alone prints steps
        assert f"[rank 1] step {i}" not in r.stdout
        for rank, log in enumerate(logs):                                          # every rank logs JSON;
            assert (log[i]["rank"], log[i]["step"]) == (rank, i)                   # the ranks agree on the loss
            assert log[i]["loss"] == pytest.approx(res["losses"][i], rel=1e-6)
    assert res["losses"][-1] < res["losses"][0]
