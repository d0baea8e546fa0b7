"""Faults of an elastic job (`sapp run --elastic`, two loopback nodes of two gloo processes, c10d
rendezvous, --nnodes 1:2) at the points tests/test_elastic.py (mid-step) and tests/test_replan.py
(inside the re-plan's search) do not reach: a whole node SIGKILLed inside a checkpoint's save,
between the save and its commit, and as a group forms at a rendezvous.  The rank at the point waits
there (SAPP_FAULT="RANK:STEP:hold-<point>", sapp/emit/runtime/checkpoint.py) until the test kills its
node: `sapp run`, torchrun's agent and both workers at once.  Each time the node left re-plans for its
two processes and resumes the last committed checkpoint - never the half-written one, which no
step is lost beyond - and trains as a fault-free run of that plan from that checkpoint; no committed
checkpoint is deleted and every checkpoint's data position is its step x global batch."""
import json
import os

import pytest

from sapp.emit.runtime.checkpoint_find import MARKER, committed
from tests.elastic_nodes import (GB, close, kill_node, node, plan4, port, rdzv_store, reference, segments,
                                 stop_all, wait)

pytestmark = pytest.mark.slow       # minutes each on two cores: `pytest -m slow`

STEPS, EVERY = 20, 5


def _out(d, i):
    p = d / f"node{i}.out"
    return p.read_text(errors="replace") if p.exists() else ""


def _held(d, line, seconds=360):
    """The node whose rank printed the hold line (waited for)."""
    return wait(lambda: [i for i in (0, 1) if line in _out(d, i)], line, seconds)[0]


def _finish(d, procs, survivor):
    """Node `survivor` (procs: [rendezvous store, node 0, node 1]) ends well, without a traceback."""
    assert procs[1 + survivor].wait(timeout=480) == 0, _out(d, survivor)[-4000:]
    assert "Traceback" not in _out(d, survivor), _out(d, survivor)[-4000:]


def _judge(d, resume_step, before, steps=STEPS, first_world=4):
    """After the fault: a group of 2 re-planned and resumed `resume_step`, the last checkpoint committed
    before the fault (`before`), trained as the re-planned plan does from that checkpoint with no fault,
    and finished; every checkpoint of `before` is still there, every data position is its step's."""
    assert before and resume_step == before[-1], (resume_step, before)
    segs = segments(d)
    down = [(e, got) for e, got in segs[1:] if e["devices"] == 2 and got]
    assert down, [e for e, _ in segs[1:]]
    event, got = down[-1]
    assert event["old"]["devices"] == 4 and event["resume_step"] == resume_step, event
    assert min(got) == resume_step and max(got) == steps - 1, sorted(got)
    ref = reference(d, event["plan"], resume_step, steps - resume_step, "ref")
    got = [got[s] for s in range(resume_step, steps)]
    assert len(got) == len(ref) and all(close(a, b) for a, b in zip(got, ref)), (got, ref)
    after = [s for s, _ in committed(str(d / "ck"))]
    assert set(before) <= set(after) and after == list(range(EVERY, steps + 1, EVERY)), (before, after)
    for s, path in committed(str(d / "ck")):
        meta = json.load(open(os.path.join(path, MARKER)))
        assert meta["data_position"] == s * GB, meta
        # the steps after the resume were written by the group of 2, the half-written step's included
        assert meta["world"] == (2 if s > resume_step else first_world), (s, meta["world"])
    assert not [n for n in os.listdir(d / "ck") if n.startswith(".tmp-")]


def _two_nodes(d, fault):
    """Both nodes, the fault planted on each (it names a rank: c10d decides which node holds it), the
    rendezvous store outside them; returns [store, node 0, node 1]."""
    rdzv = port()
    store = rdzv_store(rdzv)
    return [store, node(d, 0, rdzv, STEPS, env=fault), node(d, 1, rdzv, STEPS, env=fault)]


def _killed_while_held(tmp_path, fault: str, held: str, check_tmp) -> None:
    """Two nodes, one rank holding at `fault` (SAPP_FAULT); `check_tmp(the step-10 .tmp directory)` on
    what is on disk then; the holding rank's node killed; the other node must re-plan, resume step 5
    (never the uncommitted step 10) and match the reference."""
    plan4(tmp_path)
    procs = []
    try:
        procs = _two_nodes(tmp_path, {"SAPP_FAULT": fault})
        lost = _held(tmp_path, held)
        check_tmp(tmp_path / "ck" / f".tmp-step-{2 * EVERY:08d}")
        before = [s for s, _ in committed(str(tmp_path / "ck"))]
        kill_node(procs[1 + lost])
        _finish(tmp_path, procs, 1 - lost)
    finally:
        stop_all(procs)
    assert f"resumed from {tmp_path / 'ck' / f'step-{EVERY:08d}'}" in _out(tmp_path, 1 - lost)
    _judge(tmp_path, EVERY, before)


def test_node_killed_inside_a_save_resumes_the_last_commit(tmp_path):
    """Rank 2 holds inside the save of step 10, its shard written; its node is killed.  The other
    node's ranks, waiting in the save's collective, stop; the node re-plans for 2 and resumes step 5."""
    def mid_save(tmp):          # rank 2's shard only
        assert (tmp / "__2_0.distcp").exists() and not (tmp / MARKER).exists()
    _killed_while_held(tmp_path, f"2:{2 * EVERY}:hold-save", f"holding at save of step {2 * EVERY}", mid_save)


def test_node_killed_between_save_and_commit_never_takes_the_uncommitted(tmp_path):
    """Rank 0 holds after every rank's files of step 10 are written, before the marker: a complete
    but uncommitted checkpoint.  Its node is killed; the other node re-plans and resumes step 5."""
    def written(tmp):           # all written, no marker
        files = sorted(os.listdir(tmp))
        assert files == [".metadata"] + [f"__{r}_0.distcp" for r in range(4)], files
    _killed_while_held(tmp_path, f"0:{2 * EVERY}:hold-commit", f"holding at commit of step {2 * EVERY}", written)


def test_node_dying_as_it_joins_leaves_the_job_going(tmp_path):
    """Node 0 trains alone (a group of 2, re-planned); node 1 joins, torchrun re-forms the group of 4,
    and node 1 is killed before that group's first step (its ranks hold once the group formed).
    Node 0's ranks, forming the group with it, stop; node 0 goes back to 2 and resumes its last commit."""
    steps = 60          # paced: node 0 must still be training when node 1 has started and joins
    plan4(tmp_path)
    procs = []
    try:
        rdzv = port()
        procs = [rdzv_store(rdzv), node(tmp_path, 0, rdzv, steps, pace="0.4"), None]
        wait(lambda: max(segments(tmp_path)[-1][1], default=-1) >= EVERY + 2, "node 0 past a checkpoint", 300)
        procs[2] = node(tmp_path, 1, rdzv, steps, pace="0.4", env={"SAPP_FAULT": "*:0:hold-join"})
        _held(tmp_path, "holding at join")
        before = [s for s, _ in committed(str(tmp_path / "ck"))]
        kill_node(procs[2])
        _finish(tmp_path, procs, 0)
    finally:
        stop_all(procs)
    four = [e for e, _ in segments(tmp_path)[1:] if e["devices"] == 4]
    assert four, "node 1 never joined a group of 4"
    _judge(tmp_path, before[-1], before, steps, first_world=2)


def test_rendezvous_host_killed_before_a_commit_exits_in_one_line_then_resumes(tmp_path):
    """As above, but the rendezvous lives in node 0's agent (it binds --rdzv-endpoint first) and node 0
    holds rank 0: its loss ends the rendezvous too, so node 1 cannot re-form a group.  It ends in one
    line, non-zero, the checkpoints intact and the uncommitted step not taken; node 0 started again
    re-plans for its 2 processes and resumes step 5 as the fault-free reference does."""
    import socket
    plan4(tmp_path)
    rdzv, fault = port(), {"SAPP_FAULT": f"0:{2 * EVERY}:hold-commit"}
    procs = [None, node(tmp_path, 0, rdzv, STEPS, env=fault), None]
    try:
        def bound():
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", rdzv)) == 0
        wait(bound, "node 0's rendezvous store", 180)
        procs[2] = node(tmp_path, 1, rdzv, STEPS, env=fault)        # a later agent: a higher pid, ranks 2, 3
        assert _held(tmp_path, f"holding at commit of step {2 * EVERY}") == 0
        before = [s for s, _ in committed(str(tmp_path / "ck"))]
        kill_node(procs[1])
        rc = procs[2].wait(timeout=300)
        out = _out(tmp_path, 1)
        errors = [ln for ln in out.splitlines() if ln.startswith("sapp run: error")]
        assert rc != 0 and len(errors) == 1 and "lost the rendezvous store" in errors[0], out[-4000:]
        assert "Traceback" not in out, out[-4000:]
        assert [s for s, _ in committed(str(tmp_path / "ck"))] == before == [EVERY]
        assert (tmp_path / "ck" / f".tmp-step-{2 * EVERY:08d}" / ".metadata").exists()    # left, never taken
        procs[1] = node(tmp_path, 0, port(), STEPS)           # the job again, on the node left
        _finish(tmp_path, procs, 0)
    finally:
        stop_all(procs)
    assert f"resumed from {tmp_path / 'ck' / f'step-{EVERY:08d}'}" in _out(tmp_path, 0)
    _judge(tmp_path, EVERY, before)
