"""Interleaved pipelines beyond v = 2: searched plans with v = 3 chunks per stage, stages of
different block counts and chunks of different sizes, and torch's flex interleaving (m not a
multiple of pp), emitted with torch.distributed.pipelining's ScheduleInterleaved1F1B on 2 gloo ranks
and equal to single-process training (1e-5 relative, 3 Adam steps)."""
import json
import os
import sys

import pytest
from tests.emit_workers import joblock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL_TOL, STEPS, BATCH = 1e-5, 3, 12

# (case id, model kind, layers, pins): the pins make the search write an interleaved plan
CASES = [
    ("v3-even", "gpt6", 6, {"pp": 2, "virtual_chunks": 3, "micro_batches": 4}),
    # 7 blocks over 2 stages: 4 + 3 blocks, chunks [1, 2, 1] and [1, 1, 1]
    ("v3-uneven", "gpt7", 7, {"pp": 2, "virtual_chunks": 3, "micro_batches": 4}),
    # v = 2 divides the 6 blocks but pp * v = 4 does not: rows of 2 would give 4 + 2, priced slower
    # than 3 + 3 in chunks of 1 and 2 (the faster is kept); 3 micro-batches over 2 stages (torch's
    # flex order)
    ("v2-unequal-chunks-flex-m", "gpt6", 6, {"pp": 2, "virtual_chunks": 2, "micro_batches": 3}),
    # Llama 3's layout: v = 4 asks 8 chunks of 6 blocks, so the model's first chunk holds the embedding
    # alone and its last the head and loss alone (Dubey et al. 2024, section 3.3.2)
    ("glue-v4", "gpt6", 6, {"pp": 2, "virtual_chunks": 4, "micro_batches": 4}),
]


def _plan(tmp_path, cid, layers, pins):
    import sapp
    import sapp.models as models
    from sapp.api import search
    plan = search(models.get("gpt-tiny", device="meta", dropout=0.0, l=layers), sapp.Cluster.parse("cpu:gpus=2"),
                  global_batch=BATCH, constraints=pins)
    path = tmp_path / f"{cid}.json"
    plan.save(path)
    return plan, str(path)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("interleave")
    cases, plans = [], {}
    for cid, kind, layers, pins in CASES:
        plans[cid], path = _plan(tmp, cid, layers, pins)
        cases.append({"id": cid, "kind": kind, "plan_path": path, "steps": STEPS, "batch": BATCH})
    cpath, opath = tmp / "cases.json", tmp / "out.json"
    cpath.write_text(json.dumps(cases))
    proc = joblock.run([sys.executable, "-m", "tests.emit_workers.harness", "2", str(cpath), str(opath)],
                       cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert opath.exists(), proc.stderr[-3000:]
    out = json.loads(opath.read_text())
    assert not out["errors"], "\n".join(out["errors"].values())[-4000:]
    assert out["failed"] is None, proc.stderr[-3000:]
    return plans, out["cases"]


def test_plans_have_the_pinned_layout(job):
    plans, _ = job
    blocks = lambda p: [s["blocks"] for s in sorted(p["pipeline"]["stages"], key=lambda s: s["index"])]  # noqa: E731
    p = plans["v3-even"]
    assert p["pipeline"]["virtual_chunks"] == 3 and len(p["pipeline"]["stages"]) == 6
    assert blocks(p) == [[f"layers.{i}"] for i in range(6)]
    u = blocks(plans["v3-uneven"])
    # every virtual stage holds a block; device 0 (even virtual stages) holds 4, device 1 three
    assert all(u) and sum(len(b) for b in u[0::2]) == 4 and sum(len(b) for b in u[1::2]) == 3
    assert [b for s in u for b in s] == [f"layers.{i}" for i in range(7)]
    f = plans["v2-unequal-chunks-flex-m"]
    assert f["pipeline"]["micro_batches"] == 3
    n = [len(b) for b in blocks(f)]
    # 3 blocks a device, chunks of 1 then 2 (chunk_counts: the extra block on the last chunk)
    assert n == [1, 1, 2, 2]
    g = plans["glue-v4"]
    assert [len(b) for b in blocks(g)] == [0, 1, 1, 1, 1, 1, 1, 0]
    assert any("Llama 3's interleaved layout" in x for x in g["notes"])


@pytest.mark.parametrize("cid", [c[0] for c in CASES])
def test_interleaved_plan_matches_single_process(job, cid):
    _, res = job
    res = res[cid]
    ref = res["ref"]
    assert len(ref) == STEPS and ref[-1] != ref[0]
    for r in ("0", "1"):
        got = res["ranks"][r]
        assert got is not None, f"rank {r} reported nothing"
        for i, (a, b) in enumerate(zip(got["losses"], ref)):
            assert abs(a - b) <= REL_TOL * abs(b), f"{cid} rank {r} step {i}: {a} vs single-process {b}"
    v = {"v3": 3, "gl": 4}.get(cid[:2], 2)
    assert res["ranks"]["0"]["stages"] == list(range(0, 2 * v, 2))
    assert res["ranks"]["1"]["stages"] == list(range(1, 2 * v, 2))
