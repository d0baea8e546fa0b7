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
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow       # about 4 minutes on two cores: `pytest -m slow`

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = "tests.emit_workers.datasets:tokens"
GB, STEPS, PACE = 8, 260, "0.12"
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(d, rank, port):
    cmd = [sys.executable, "-m", "sapp.cli", "run", str(d / "plan.json"), "--model", "gpt-tiny", "--model-arg",
           "dropout=0", "--steps", str(STEPS), "--data", DATA, "--nnodes", "1:2", "--node-rank", str(rank),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "elastic-test",
           "--max-restarts", "3", "--elastic", "--checkpoint-dir", str(d / "ck"), "--checkpoint-every", "5",
           "--keep", "50", "--log-json", str(d / f"node{rank}.jsonl"), "--rdzv-timeout", "120"]
    out = open(d / f"node{rank}.out", "a")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                            env=dict(ENV, SAPP_TEST_PACE=PACE))


def _records(path):
    if not os.path.exists(path):
        return []
    out = []
    for ln in open(path).read().splitlines():
        try:
            out.append(json.loads(ln))
        except ValueError:
            pass                      # a line being written
    return out


def _wait(cond, what, seconds=240):
    deadline = time.time() + seconds
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _rank0(d):
    """Rank 0's records, whichever node held it in each group (c10d assigns ranks in joining order,
    not by --node-rank), in time order."""
    return sorted(_records(d / "node0.jsonl") + _records(d / "node1.jsonl"), key=lambda r: r.get("time", 0))


def _segments(d):
    """[(replan event or None, {step: loss})]: rank 0's steps, split at each group's start."""
    segs = [(None, {})]
    for r in _rank0(d):
        if r.get("event") == "replan":
            segs.append((r, {}))
        elif "loss" in r and r.get("step") is not None:
            segs[-1][1][r["step"]] = r["loss"]
    return segs


def _reference(d, plan, resume_step, steps, name):
    """The same plan resumed from the same checkpoint, with no fault: losses of steps resume_step.."""
    n = json.load(open(plan))["devices"]
    p = subprocess.run([sys.executable, "-m", "sapp.cli", "run", str(plan), "--model", "gpt-tiny", "--model-arg",
                        "dropout=0", "--steps", str(resume_step + steps), "--data", DATA, "--nproc", str(n),
                        "--resume", str(d / "ck" / f"step-{resume_step:08d}"), "--out", str(d / f"{name}.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return json.load(open(d / f"{name}.json"))["losses"][resume_step:]


def _close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


def test_lose_a_node_replan_resume_and_scale_back_up(tmp_path):
    from sapp.api import search
    search("gpt-tiny", "cpu:gpus=2,nodes=2", global_batch=GB, constraints={"pp": 2, "dp": 2}).save(tmp_path / "plan.json")
    port = _port()
    log0 = tmp_path
    procs = [_node(tmp_path, 0, port), _node(tmp_path, 1, port)]
    try:
        kill_at = random.Random().randint(8, 20)
        _wait(lambda: any(r.get("step", -1) >= kill_at for r in _rank0(tmp_path)), f"step {kill_at}")
        # the node that does not hold rank 0 is lost: its sapp run is SIGKILLed, its agent and workers follow
        lost = 1 if (tmp_path / "node0.jsonl").exists() else 0
        procs[lost].send_signal(signal.SIGKILL)
        procs[lost].wait(timeout=30)
        down = _wait(lambda: next((e for e, _ in _segments(log0)[1:] if e["devices"] == 2), None), "the re-plan to 2")
        assert down["new"]["devices"] == 2 and down["old"]["devices"] == 4, down
        assert os.path.exists(down["plan"]) and "/plans/step-" in down["plan"]
        # a few steps under the new plan, then node 1 comes back
        _wait(lambda: len(_segments(log0)[-1][1]) >= 8, "steps after the re-plan")
        procs[lost] = _node(tmp_path, lost, port)
        _wait(lambda: any(e and e["devices"] == 4 for e, _ in _segments(log0)[2:]), "the group of 4 again", 300)
        for i in (1 - lost, lost):
            assert procs[i].wait(timeout=400) == 0, (tmp_path / f"node{i}.out").read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    segs = _segments(tmp_path)
    down_i = next(i for i, (e, _) in enumerate(segs) if e and e["devices"] == 2)
    up_i = next(i for i, (e, _) in enumerate(segs) if i > down_i and e and e["devices"] == 4)
    # every step of the two segments, against a fault-free run of the same plan from the same checkpoint
    for i, plan, name in ((down_i, segs[down_i][0]["plan"], "ref-down"), (up_i, str(tmp_path / "plan.json"), "ref-up")):
        steps = segs[i][1]
        start = min(steps)
        ckpts = sorted(int(n[5:]) for n in os.listdir(tmp_path / "ck") if n.startswith("step-"))
        assert start in ckpts or start == 0, (start, ckpts)
        n = min(6, len(steps))
        ref = _reference(tmp_path, plan, start, n, name)
        got = [steps[s] for s in range(start, start + n)]
        assert all(_close(a, b) for a, b in zip(got, ref)), (name, got, ref)
    # no sample lost or repeated: each checkpoint's data position is its step's
    for n in os.listdir(tmp_path / "ck"):
        if n.startswith("step-"):
            meta = json.load(open(tmp_path / "ck" / n / "sapp-checkpoint.json"))
            assert meta["data_position"] == meta["step"] * GB, meta
    final = max(segs[-1][1])
    assert final == STEPS - 1
