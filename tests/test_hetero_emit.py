"""A mixed-cluster plan with uneven data shares runs on gloo and trains as one process does."""
import json
import os
import sys

import pytest

from sapp.emit.dp.hetero_data import rank_slices
from sapp.errors import PlanError
from tests.emit_workers import hetero_job, joblock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def plan_doc():
    """Two one-device groups, the first declared 3x slower: the search gives it a quarter of the batch."""
    import torch
    from sapp.api import mixed as hetero_plan
    from sapp.cluster.groups import parse
    # compute-bound figures (no launch overhead, memory 1e4x faster): step time linear in the share
    spec = "cpu:gpus=1,peak_flops={},op_overhead=0,update_op_overhead=0,inter_latency=0,mem_bandwidth={},rng_rate=1e12"
    mc = parse(spec.format("0.1GFLOP/s", "1TB/s") + "+" + spec.format("0.3GFLOP/s", "3TB/s"))
    m = hetero_job.model()
    doc, _ = hetero_plan.search(m, mc, global_batch=64, example_inputs=(torch.randn(8, hetero_job.D).double(),),
                                q=4)
    return doc


def _run(doc, tmp_path, *extra):
    p, out = tmp_path / "plan.json", tmp_path / "out.json"
    p.write_text(json.dumps(doc))
    proc = joblock.run([sys.executable, "-m", "tests.emit_workers.hetero_job", str(p), str(out), "3", *extra],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def _max_diff(a, b):
    return max(abs(x - y) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


@pytest.mark.slow       # ~45 s; the default suite runs uneven shares through `sapp run` (test_hetero_run.py)
def test_uneven_shares_train_as_one_process(plan_doc, tmp_path):
    shares = [g["batch_share"] for g in plan_doc["groups"]["members"]]
    assert shares == [16, 48]            # 3x slower: a quarter of the batch
    out = _run(plan_doc, tmp_path)
    assert out["rank_slices"] == [[0, shares[0]], [shares[0], 64]]
    assert _max_diff(out["params"], out["ref"]) <= 1e-9
    # the plain mean over ranks weighs the small share's samples more: not one process's update
    plain = _run(plan_doc, tmp_path, "unweighted")
    assert _max_diff(plain["params"], plain["ref"]) > 1e-6


def test_layouts_the_emitter_cannot_split_are_refused(plan_doc):
    doc = json.loads(json.dumps(plan_doc))
    g = next(g for g in doc["groups"]["members"] if g["batch_share"])
    g["parallel"]["tp"] = 2
    with pytest.raises(PlanError, match="data-parallel groups only"):
        rank_slices(doc)
