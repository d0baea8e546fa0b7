"""Every rank starts from rank 0's weights (sapp/emit/steps/same_start.py).  tab-transformer-pytorch's
FT-Transformer picks each layer's initial residual stream with Python's `random` (hyper-connections),
so two processes seeded alike by torch built different `static_alpha`; sapp's dp2 plan trained the two
replicas apart with no error.  Here the ranks' Python generators differ on purpose: after 3 Adam steps
every parameter is the same on both ranks, and the losses are one process's trained from rank 0's
weights."""
import importlib.util
import json
import os
import random
import subprocess
import sys

import pytest
import torch

if importlib.util.find_spec("tab_transformer_pytorch") is None:
    pytest.skip("tab-transformer-pytorch is not installed (the probe extra)", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ranks_that_built_different_weights_train_as_one_process(tmp_path):
    import sapp
    from tests.emit_workers import joblock, lib_models
    random.seed(1000)                                  # rank 0's Python generator: the reference's model
    model, loss_fn = lib_models.build("ft_transformer", seed=0)
    x, y = lib_models.batch("ft_transformer", 8, 0)
    plan = sapp.search(lib_models.build("ft_transformer", device="meta")[0], "cpu:gpus=2", global_batch=8,
                       example_inputs=x, loss_fn=loss_fn, targets=y, precision="fp32",
                       constraints={"dp": 2, "tp": 1, "pp": 1, "zero": 0, "placement": {"optimizer": "device"}})
    plan.save(tmp_path / "p.json")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ref = []
    for s in range(3):
        inputs, target = lib_models.batch("ft_transformer", 8, s)
        opt.zero_grad()
        loss = loss_fn(model(*inputs), target)
        loss.backward()
        opt.step()
        ref.append(float(loss))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = joblock.run([sys.executable, "-m", "tests.emit_workers.same_start_job", str(tmp_path / "p.json"),
                        str(tmp_path / "out.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert (tmp_path / "out.json").exists(), proc.stderr[-3000:]
    ranks = json.loads((tmp_path / "out.json").read_text())
    assert all("error" not in got for got in ranks.values()), [got.get("error") for got in ranks.values()]
    a, b = ranks["0"]["params"], ranks["1"]["params"]
    assert a.keys() == b.keys() and any("static_alpha" in n for n in a)
    assert all(a[n] == b[n] for n in a), [n for n in a if a[n] != b[n]][:3]        # the replicas agree
    for r, got in ranks.items():
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got["losses"], ref)), (r, got["losses"], ref)
        assert any("every rank starts from rank 0's" in n for n in got["notes"]), got["notes"]
