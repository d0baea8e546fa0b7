"""Issue 53, finding 2: `sapp run --nnodes 2` (or 1:2, or a full-width '２') without --rdzv-endpoint ran
torchrun's static rendezvous, listening unauthenticated on [::]:29500, ignoring --rdzv-timeout and
silent for 240 s.  Now it is refused in one line before anything starts; a node that waits for the
others says who is missing every few seconds, and a node whose node 0 never comes up waits
--rdzv-timeout, not the store's 60 s."""
import os
import socket
import subprocess
import sys
import time

import pytest

from sapp.commands.cli import main
from tests.test_run_exposure import ENV, ROOT, _tree, listening


def _plan(tmp_path, nodes=2):
    import sapp.models as models
    from tests.emit_workers.plans import make_plan
    plan = make_plan(name="gpt-tiny", params=models.info("gpt-tiny")["params"], global_batch=8, dp=2)
    if nodes > 1:
        plan._d["mesh"] = {"levels": [{"size": 2, "link": "inter"}]}
    path = tmp_path / "p.json"
    plan.save(path)
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("extra, needle", [
    (["--nnodes", "2"], "--rdzv-endpoint"), (["--nnodes", "1:2"], "--rdzv-endpoint"),
    (["--nnodes", "\uff12"], "ASCII"), (["--nnodes", "1:\uff12", "--rdzv-endpoint", "127.0.0.1:1"], "ASCII"),
    (["--nnodes", "2", "--node-rank", "\uff11", "--rdzv-endpoint", "127.0.0.1:1"], "--node-rank"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:1"], "--node-rank"),
    (["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "29500"], "--rdzv-endpoint"),
    (["--nnodes", "2", "--rdzv-backend", "static", "--rdzv-endpoint", "127.0.0.1:1"], "--rdzv-backend"),
    (["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-timeout", "0"], "--rdzv-timeout"),
])
def test_multi_node_without_a_safe_rendezvous_is_refused_before_launch(extra, needle, tmp_path, capsys, monkeypatch):
    def launched(*a, **k):
        raise AssertionError("the launcher was started")
    monkeypatch.setattr("subprocess.call", launched)
    rc = main(["run", _plan(tmp_path), "--model", "gpt-tiny"] + extra)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and needle in err and "Traceback" not in err, err


def test_nnodes_2_without_endpoint_ends_at_once_and_binds_nothing(tmp_path):
    """The command as a user types it: out within seconds, one line, and no listener in its process tree
    (the old code held [::]:29500 until it was killed)."""
    cmd = [sys.executable, "-m", "sapp.commands.cli", "run", _plan(tmp_path), "--model", "gpt-tiny", "--nnodes", "2",
           "--rdzv-timeout", "3"]
    job = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen, t0 = set(), time.time()
    try:
        while job.poll() is None and time.time() - t0 < 60:
            seen |= listening(_tree(job.pid))
            time.sleep(0.05)
    finally:
        if job.poll() is None:
            job.kill()
        out, err = job.communicate(timeout=30)
    assert job.returncode == 2, err[-2000:]
    assert time.time() - t0 < 60 and seen == set(), seen
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--rdzv-endpoint" in lines[0] and "launching" not in out, (out, err)
    with socket.socket(socket.AF_INET6) as s:      # and nobody else holds torchrun's default port for it
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("::", 0))


def test_nnodes_1_without_endpoint_is_a_single_node_run(tmp_path):
    """`--nnodes 1` took torchrun's static rendezvous ([::]:29500) too; it is now the loopback single-node run."""
    from sapp.commands import run as run_cmd
    import argparse
    p = argparse.ArgumentParser()
    run_cmd.add_arguments(p)
    args = p.parse_args([_plan(tmp_path, nodes=1), "--model", "gpt-tiny", "--nnodes", "1"])
    args.model = "gpt-tiny"
    cmd = run_cmd.command(args, 2)
    assert "--local-addr=127.0.0.1" in cmd and "--rdzv-endpoint=127.0.0.1:0" in cmd, cmd


def _node(tmp_path, rank, port, timeout_s):
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "sapp.commands.cli", "run", _plan(tmp_path), "--model", "gpt-tiny",
                        "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", f"127.0.0.1:{port}",
                        "--rdzv-id", "alone", "--rdzv-timeout", str(timeout_s)],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240)
    return p, time.time() - t0


def test_a_waiting_node_names_the_missing_one_while_it_waits(tmp_path):
    port = _free_port()
    p, took = _node(tmp_path, 0, port, 6)
    waits = [ln for ln in p.stderr.splitlines() if ln.startswith("sapp run: waiting for the rendezvous")]
    errors = [ln for ln in p.stderr.splitlines() if "sapp run: error" in ln]
    assert p.returncode != 0 and len(errors) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert waits and all(f"127.0.0.1:{port}: node 1 of 2 not joined yet (joined: 0 (" in ln for ln in waits), waits
    print(f"{len(waits)} progress lines; ended {took:.1f} s after the start (timeout 6 s)")


def test_a_node_without_its_node_0_waits_the_rdzv_timeout_not_60_s():
    """Node 0's address refuses connections (it is not up yet): a node that cannot host the store (the
    address is another machine's, here is_host=false) retried for the store's 60 s read timeout
    whatever --rdzv-timeout said; now for --rdzv-timeout, then one line.  (On loopback, as in the tests
    above, a lone node binds the address itself and hosts.)"""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
    from sapp.emit.runtime import launch
    params = RendezvousParameters(backend=launch.BACKEND, endpoint=f"127.0.0.1:{_free_port()}", run_id="alone",
                                  min_nodes=2, max_nodes=2, join_timeout="3", is_host="false")
    t0 = time.time()
    with pytest.raises(RendezvousConnectionError, match="within --rdzv-timeout 3 s"):
        launch._create_handler(params)
    assert time.time() - t0 < 20, f"took {time.time() - t0:.1f} s"
