"""Multi-node launch as a user runs it on two machines: two `sapp run` agents (torchrun, c10d rendezvous
on 127.0.0.1), one process each, train a 2-node dp=2 plan of gpt-tiny on a dataset factory; the losses
match single-process training of the same global batches within 1e-5 relative."""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = "tests.emit_workers.datasets:tokens"
STEPS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _single_process_losses():
    import sapp.models as models
    from sapp.emit import emit
    from sapp.emit.runtime.data import Batches, make_dataset
    from tests.emit_workers.plans import make_plan
    torch.manual_seed(0)
    m = models.get("gpt-tiny", device="cpu", dropout=0.0)
    prog = emit(m, make_plan(params=models.info("gpt-tiny")["params"], global_batch=8), rank=0, world=1)
    b = Batches(8, dataset=make_dataset(DATA))
    return [prog.step(*b(i)) for i in range(STEPS)]


def test_two_agents_on_localhost_match_single_process(tmp_path):
    import sapp.models as models
    from tests.emit_workers.plans import make_plan
    plan = make_plan(name="gpt-tiny", params=models.info("gpt-tiny")["params"], global_batch=8, dp=2)
    plan._d["mesh"] = {"levels": [{"size": 2, "link": "inter"}]}       # one device on each of 2 nodes
    plan.save(tmp_path / "plan.json")
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    agents = [subprocess.Popen(
        [sys.executable, "-m", "sapp.commands.cli", "run", str(tmp_path / "plan.json"), "--model", "gpt-tiny",
         "--model-arg", "dropout=0", "--steps", str(STEPS), "--data", DATA, "--out", str(tmp_path / "out.json"),
         "--nnodes", "2", "--node-rank", str(node), "--rdzv-backend", "c10d",
         "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "sapp-test"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    outs = []
    try:
        for a in agents:
            outs.append(a.communicate(timeout=300))
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
    for a, (out, err) in zip(agents, outs):
        assert a.returncode == 0, out[-2000:] + err[-3000:]
        assert "launching 1 process(es) per node" in out
    res = json.loads((tmp_path / "out.json").read_text())
    assert res["devices"] == 2 and res["parallel"]["dp"] == 2
    ref = _single_process_losses()
    print("2-node losses", res["losses"], "single process", ref,
          "max rel diff", max(abs(a - b) / abs(b) for a, b in zip(res["losses"], ref)))
    assert res["losses"] == pytest.approx(ref, rel=1e-5)
    assert res["losses"][-1] != ref[0]          # it trained on different batches
