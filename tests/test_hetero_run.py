"""`sapp run` of a mixed-cluster plan (sapp/commands/run_hetero.py, sapp/emit/runtime/hetero_run.py): a
two-group CPU cluster, one group declared 3x slower, trains its uneven shares on 3 gloo ranks equal to one
process in float64; nodes whose device is not their group's, and groups the emitter cannot split, are
refused in one line before anything runs."""
import json
import os
import subprocess
import sys

import pytest
import torch

from sapp.commands.run_hetero import Node, choose, kind_of
from sapp.errors import PlanError, UsageError
from tests.emit_workers import hetero_job, joblock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "tests.emit_workers.hetero_job:factory"
GB, STEPS = 48, 3
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture(scope="module")
def plan_doc():
    """Group `cpu`: 1 device; group `cpu-2`: 2 devices, each 3x faster (compute-bound figures)."""
    from sapp.api import mixed as hetero_plan
    from sapp.cluster.groups import parse
    spec = ("cpu:gpus={},peak_flops={},op_overhead=0,update_op_overhead=0,inter_latency=0,mem_bandwidth={},"
            "rng_rate=1e12")
    mc = parse(spec.format(1, "0.1GFLOP/s", "1TB/s") + "+" + spec.format(2, "0.3GFLOP/s", "3TB/s"))
    doc, _ = hetero_plan.search(MODEL, mc, global_batch=GB, q=4)
    return doc


def _cli(tmp_path, doc, *extra, timeout=120):
    plan = tmp_path / "mixed.json"
    plan.write_text(json.dumps(doc))
    return joblock.run([sys.executable, "-m", "sapp.commands.cli", "run", str(plan), "--model", MODEL, "--steps", str(STEPS),
                        *extra], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def _reference(x, y, rows):
    """One process's losses on the whole global batches (Adam, lr 1e-3 as `sapp run`'s default), and the
    losses of the plain mean over ranks (every rank's mean loss weighed alike), which uneven shares make wrong."""
    out = []
    for weighted in (True, False):
        m = hetero_job.model()
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        losses = []
        for k in range(STEPS):
            opt.zero_grad()
            xs, ys = x[k * GB:(k + 1) * GB], y[k * GB:(k + 1) * GB]
            whole = torch.nn.functional.mse_loss(m(xs), ys)
            loss = whole if weighted else sum(torch.nn.functional.mse_loss(m(xs[a:b]), ys[a:b]) for a, b in rows) / len(rows)
            loss.backward()
            opt.step()
            losses.append(whole.item())
        out.append(losses)
    return out


def test_uneven_shares_run_as_one_process(plan_doc, tmp_path):
    assert [g["batch_share"] for g in plan_doc["groups"]["members"]] == [12, 36]      # 1 : 3, per device 12 : 18
    x, y = hetero_job.batch(0, GB * STEPS)
    torch.save(((x,), y), tmp_path / "data.pt")
    p = _cli(tmp_path, plan_doc, "--data", str(tmp_path / "data.pt"), "--out", str(tmp_path / "out.json"), timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "launching 3 process(es)" in p.stdout
    assert "group cpu rank 0 (12 samples each), group cpu-2 ranks 1-2 (18 samples each)" in p.stdout
    losses = json.loads((tmp_path / "out.json").read_text())["losses"]
    ref, plain = _reference(x, y, [(0, 12), (12, 30), (30, 48)])
    assert len(losses) == STEPS and max(abs(a - b) for a, b in zip(losses, ref)) <= 1e-9, (losses, ref)
    assert max(abs(a - b) for a, b in zip(plain, ref)) > 1e-6       # the weighting is what makes them equal


def _renamed(doc, old, new):
    doc = json.loads(json.dumps(doc))
    for g in doc["groups"]["members"] + doc["cluster"]["groups"]:
        if g["name"] == old:
            g["name"] = new
    return doc


@pytest.mark.parametrize("case", ["node-not-its-group", "one-node-job", "tp-group"])
def test_refused_in_one_line_before_launch(plan_doc, tmp_path, case):
    doc = _renamed(plan_doc, "cpu-2", "h100-80g")      # a group planned for H100s, on this CPU machine
    extra, words = ["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29599", "--group", "h100-80g"], \
        "group h100-80g is planned for h100 devices but this node has cpu: run group h100-80g on h100 nodes " \
        "and start this node with --group cpu"
    if case == "one-node-job":
        extra, words = [], ("this one-node job runs every group of the plan, but group h100-80g is planned for h100 "
                            "devices and this node has cpu: run group h100-80g on h100 nodes, one `sapp run --nnodes N` "
                            "on each node of each group")
    if case == "tp-group":
        doc = json.loads(json.dumps(plan_doc))
        doc["groups"]["members"][1]["plan"]["parallel"].update(dp=1, tp=2)
        extra, words = [], "group cpu-2 runs tp=2: uneven shares are emitted for data-parallel groups only"
    p = _cli(tmp_path, doc, *extra)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert words in p.stderr and "launching" not in p.stdout and "step" not in p.stdout
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_nodes_map_to_groups_by_the_device_they_report(plan_doc):
    doc = _renamed(_renamed(plan_doc, "cpu-2", "h100-80g"), "cpu", "a100-80g")
    for g in doc["cluster"]["groups"]:
        g["device_memory"] = 80e9
    a100, h100 = Node("NVIDIA A100-SXM4-80GB", 85.1e9), Node("NVIDIA H100 80GB HBM3", 85.0e9)
    assert kind_of(a100.device) == "a100" and kind_of("gh200-superchip") == "gh200" and kind_of("NVIDIA L40S") == "l40"
    assert choose(doc, a100, None, False, None) == ("a100-80g", 1)
    assert choose(doc, h100, None, False, None) == ("h100-80g", 2)          # the group's devices per node
    assert choose(doc, h100, "h100-80g", False, 1) == ("h100-80g", 1)       # --nproc: 2 nodes of 1
    with pytest.raises(PlanError, match="planned with 80 GB devices but this node's NVIDIA A100-PCIE-40GB has 42.4 GB"):
        choose(doc, Node("NVIDIA A100-PCIE-40GB", 42.4e9), "a100-80g", False, None)
    with pytest.raises(PlanError, match="no group of the plan is planned for v100"):
        choose(doc, Node("Tesla V100-SXM2-32GB", 34e9), None, False, None)
    with pytest.raises(PlanError, match="but this node has NVIDIA H100 80GB HBM3: run group a100-80g on a100 nodes "
                                        "and start this node with --group h100-80g"):
        choose(doc, h100, "a100-80g", False, None)
    with pytest.raises(UsageError, match="fit groups cpu, cpu-2; say which this node runs with --group NAME"):
        choose(plan_doc, Node("cpu"), None, False, None)
    with pytest.raises(UsageError, match="is not a group of this plan; its groups are a100-80g, h100-80g"):
        choose(doc, h100, "h200", False, None)
    with pytest.raises(UsageError, match="which 4 processes per node do not divide"):
        choose(doc, h100, "h100-80g", False, 4)
    assert choose(plan_doc, Node("cpu"), None, True, None) == (None, 3)     # one node: every group


def test_the_ranks_check_every_group_has_its_devices(plan_doc):
    from sapp.emit.runtime import hetero_run
    with pytest.raises(PlanError, match=r"need cpu: 1, cpu-2: 2 processes but this job has cpu-2: 1"):
        hetero_run.place(plan_doc, "cpu-2", 0, 1)
    plan = hetero_run.rank_plan(plan_doc, "cpu", 3)
    assert plan.parallel["dp"] == 3 and plan.model["global_batch"] == GB and plan.zero == 1
