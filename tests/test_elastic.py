"""`sapp run --elastic` on two loopback "nodes" of two processes each (c10d rendezvous, --nnodes
1:2): node 1 is killed with SIGKILL at a random step; node 0's group re-plans for the two processes
left (pp2 x dp2 -> a 2-device layout, written to ck/plans/), resumes the last checkpoint and trains
on; node 1 is started again, joins at the next rendezvous, and the job returns to the plan's own
four-process layout.  After each resume every step has the loss of a reference run that switched to
the same plan at the same checkpoint without a fault, and the data position recorded in each
checkpoint is step x global batch (no sample lost or repeated)."""
import json
import os
import random
import signal

import pytest

from tests.elastic_nodes import GB, close, node, plan4, port, rank0, reference, segments, stop_all, wait

pytestmark = pytest.mark.slow       # about 4 minutes on two cores: `pytest -m slow`

STEPS, PACE = 260, "0.12"


def _node(d, rank, rdzv_port):
    return node(d, rank, rdzv_port, STEPS, pace=PACE)


def test_lose_a_node_replan_resume_and_scale_back_up(tmp_path):
    plan4(tmp_path)
    rdzv = port()
    log0 = tmp_path
    procs = [_node(tmp_path, 0, rdzv), _node(tmp_path, 1, rdzv)]
    try:
        kill_at = random.Random().randint(8, 20)
        wait(lambda: any(r.get("step", -1) >= kill_at for r in rank0(tmp_path)), f"step {kill_at}")
        # the node that does not hold rank 0 is lost: its sapp run is SIGKILLed, its agent and workers follow
        lost = 1 if (tmp_path / "node0.jsonl").exists() else 0
        procs[lost].send_signal(signal.SIGKILL)
        procs[lost].wait(timeout=30)
        down = wait(lambda: next((e for e, _ in segments(log0)[1:] if e["devices"] == 2), None), "the re-plan to 2")
        assert down["new"]["devices"] == 2 and down["old"]["devices"] == 4, down
        assert os.path.exists(down["plan"]) and "/plans/step-" in down["plan"]
        # a few steps under the new plan, then node 1 comes back
        wait(lambda: len(segments(log0)[-1][1]) >= 8, "steps after the re-plan")
        procs[lost] = _node(tmp_path, lost, rdzv)
        wait(lambda: any(e and e["devices"] == 4 for e, _ in segments(log0)[2:]), "the group of 4 again", 300)
        for i in (1 - lost, lost):
            assert procs[i].wait(timeout=400) == 0, (tmp_path / f"node{i}.out").read_text()[-3000:]
    finally:
        stop_all(procs)
    segs = segments(tmp_path)
    down_i = next(i for i, (e, _) in enumerate(segs) if e and e["devices"] == 2)
    up_i = next(i for i, (e, _) in enumerate(segs) if i > down_i and e and e["devices"] == 4)
    # every step of the two segments, against a fault-free run of the same plan from the same checkpoint
    for i, plan, name in ((down_i, segs[down_i][0]["plan"], "ref-down"), (up_i, str(tmp_path / "plan.json"), "ref-up")):
        steps = segs[i][1]
        start = min(steps)
        ckpts = sorted(int(n[5:]) for n in os.listdir(tmp_path / "ck") if n.startswith("step-"))
        assert start in ckpts or start == 0, (start, ckpts)
        n = min(6, len(steps))
        ref = reference(tmp_path, plan, start, n, name)
        got = [steps[s] for s in range(start, start + n)]
        assert all(close(a, b) for a, b in zip(got, ref)), (name, got, ref)
    # no sample lost or repeated: each checkpoint's data position is its step's
    for n in os.listdir(tmp_path / "ck"):
        if n.startswith("step-"):
            meta = json.load(open(tmp_path / "ck" / n / "sapp-checkpoint.json"))
            assert meta["data_position"] == meta["step"] * GB, meta
    final = max(segs[-1][1])
    assert final == STEPS - 1
