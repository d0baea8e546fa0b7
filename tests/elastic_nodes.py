"""Two loopback "nodes" of an elastic `sapp run` (c10d rendezvous, --nnodes 1:2, two gloo processes
each), shared by tests/test_elastic.py and tests/test_elastic_faults.py: starting a node, killing one
whole (its `sapp run`, torchrun's agent and the workers, with SIGKILL), reading rank 0's --log-json
whichever node held rank 0, and the fault-free reference a resumed segment is judged against."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = "tests.emit_workers.datasets:tokens"
GB = 8
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plan4(d):
    """gpt-tiny as pp2 x dp2 on two nodes of two devices: a re-plan for one node changes the layout."""
    from sapp.api import search
    search("gpt-tiny", "cpu:gpus=2,nodes=2", global_batch=GB, constraints={"pp": 2, "dp": 2}).save(d / "plan.json")
    return d / "plan.json"


def node(d, rank, rdzv_port, steps, pace="0", env=None, every=5, restarts=3):
    """Node `rank` of the job in `d` (plan d/plan.json, checkpoints in d/ck, rank 0's log in
    d/node<rank>.jsonl when it holds rank 0, its output appended to d/node<rank>.out).  --keep 100: no
    checkpoint is deleted (the references resume early ones; test_elastic's 260 steps write 52)."""
    cmd = [sys.executable, "-m", "sapp.commands.cli", "run", str(d / "plan.json"), "--model", "gpt-tiny", "--model-arg",
           "dropout=0", "--steps", str(steps), "--data", DATA, "--nnodes", "1:2", "--node-rank", str(rank),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv_port}", "--rdzv-id", "elastic-test",
           "--max-restarts", str(restarts), "--elastic", "--checkpoint-dir", str(d / "ck"), "--checkpoint-every",
           str(every), "--keep", "100", "--log-json", str(d / f"node{rank}.jsonl"), "--rdzv-timeout", "120"]
    out = open(d / f"node{rank}.out", "a")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                            env=dict(ENV, SAPP_TEST_PACE=pace, **(env or {})))


def _tree(pid):
    """pid and every process below it (torchrun starts each worker in a session of its own, so a
    process group would miss them): from /proc's parent links."""
    kids = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = open(f"/proc/{p}/stat").read()
            except OSError:
                continue
            kids.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(p))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def kill_node(proc):
    """SIGKILL a node at once: every process of its tree is stopped first (SIGSTOP), so none of them
    sees another die and reacts (an agent restarting workers, a lifeline's clean exit), then killed."""
    pids = _tree(proc.pid)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
    proc.wait(timeout=30)


def records(path):
    if not os.path.exists(path):
        return []
    out = []
    for ln in open(path).read().splitlines():
        try:
            out.append(json.loads(ln))
        except ValueError:
            pass                      # a line being written
    return out


def wait(cond, what, seconds=240):
    deadline = time.time() + seconds
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def rank0(d):
    """Rank 0's records, whichever node held it in each group (c10d assigns ranks in joining order,
    not by --node-rank), in time order."""
    return sorted(records(d / "node0.jsonl") + records(d / "node1.jsonl"), key=lambda r: r.get("time", 0))


def segments(d):
    """[(replan event or None, {step: loss})]: rank 0's steps, split at each group's start."""
    segs = [(None, {})]
    for r in rank0(d):
        if r.get("event") == "replan":
            segs.append((r, {}))
        elif "loss" in r and r.get("step") is not None:
            segs[-1][1][r["step"]] = r["loss"]
    return segs


def reference(d, plan, resume_step, steps, name):
    """The same plan resumed from the same checkpoint, with no fault: losses of steps resume_step.."""
    n = json.load(open(plan))["devices"]
    p = subprocess.run([sys.executable, "-m", "sapp.commands.cli", "run", str(plan), "--model", "gpt-tiny", "--model-arg",
                        "dropout=0", "--steps", str(resume_step + steps), "--data", DATA, "--nproc", str(n),
                        "--resume", str(d / "ck" / f"step-{resume_step:08d}"), "--out", str(d / f"{name}.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return json.load(open(d / f"{name}.json"))["losses"][resume_step:]


def close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


def stop_all(procs):
    """Clean-up, also after a failed assertion: every node still running is killed whole."""
    for p in procs:
        if p is not None and p.poll() is None:
            kill_node(p)


def rdzv_store(at):
    """The rendezvous store in a process of its own, as on a host that is none of the nodes (torch's
    c10d rendezvous lives in the store of whichever node's agent binds --rdzv-endpoint first: that
    node's loss ends the job, tests/test_elastic_faults.py shows how).  The nodes' launchers find the
    port taken and join as clients (sapp/emit/runtime/launch.py)."""
    code = ("import sys, time; from datetime import timedelta; from torch.distributed import TCPStore; "
            "s = TCPStore('127.0.0.1', int(sys.argv[1]), is_master=True, wait_for_workers=False, "
            "timeout=timedelta(seconds=900)); time.sleep(1800)")
    p = subprocess.Popen([sys.executable, "-c", code, str(at)], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL)

    def listening():
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", at)) == 0 or p.poll() is not None
    wait(listening, "the rendezvous store", 120)
    assert p.poll() is None, "the rendezvous store did not start"
    return p
