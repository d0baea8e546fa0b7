"""A FIFO or a device file wherever sapp reads (issue 53 item 7): a plan path, --log-json, --data, a
checkpoint directory's step folders and markers, plans/ of an elastic job, the capture cache.  Each
is refused in one line or skipped, never blocking (every call here is bounded by a timeout: a
blocked open() would hang forever)."""
import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
RUN = ["--model", "gpt-tiny", "--steps", "1"]


def _sapp(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "sapp.commands.cli", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=ENV)


def _one_line(p, says):
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "loss" not in p.stdout, p.stdout[-2000:]          # refused before any training


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    from sapp.api import search
    path = tmp_path_factory.mktemp("special") / "plan.json"
    search("gpt-tiny", "cpu:gpus=1", global_batch=4).save(path)
    return path


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("cmd", [["replan", "--nodes", "1"], ["evaluate"], ["explain"], ["run", *RUN]])
def test_a_plan_path_that_is_a_fifo_or_a_device_is_refused_in_one_line(cmd, fifo):
    for path in (fifo, "/dev/zero"):
        p = _sapp(cmd[0], path, *cmd[1:], timeout=60)
        _one_line(p, "FIFO" if path == fifo else "device")


def test_log_json_and_data_that_are_fifos_are_refused_in_one_line(plan, fifo):
    _one_line(_sapp("run", plan, *RUN, "--log-json", fifo, timeout=60), "not a regular file")
    _one_line(_sapp("run", plan, *RUN, "--log-json", "/dev/null", timeout=60), "not a regular file")
    # was "data file ... not found" for a FIFO that exists
    _one_line(_sapp("run", plan, *RUN, "--data", fifo, timeout=60), "is a FIFO")


def test_checkpoint_folders_that_are_fifos_are_refused_before_training(plan, tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    os.mkfifo(ck / "step-00000002")
    _one_line(_sapp("run", plan, *RUN, "--checkpoint-dir", ck, "--resume", timeout=60), "is not a directory")
    # a step folder whose marker is a FIFO is not sapp's: resume skips it, and a run that would save that
    # step is refused before launching (it trained, then failed at the save with torch's log lines)
    ck2 = tmp_path / "ck2"
    (ck2 / "step-00000001").mkdir(parents=True)
    os.mkfifo(ck2 / "step-00000001" / "sapp-checkpoint.json")
    _one_line(_sapp("run", plan, *RUN, "--checkpoint-dir", ck2, "--resume", timeout=60), "is in the way of step 1")
    _one_line(_sapp("run", plan, *RUN, "--resume", ck2 / "step-00000001", timeout=60), "cannot resume")


def _bounded(call, seconds=10):
    def boom(*_):
        raise TimeoutError("blocked")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        return call()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_plans_and_markers_that_are_fifos_never_block(tmp_path):
    from sapp.emit.runtime.checkpoint_find import committed, verify
    from sapp.fileio import write_atomic
    ck = tmp_path / "ck"
    (ck / "plans").mkdir(parents=True)
    target = ck / "plans" / "step-00000003-devices-1.json"
    os.mkfifo(target)
    _bounded(lambda: write_atomic(str(target), "{}", under=str(ck)))        # the FIFO replaced, not opened
    assert target.is_file() and target.read_text() == "{}"
    (ck / "step-00000004").mkdir()
    os.mkfifo(ck / "step-00000004" / "sapp-checkpoint.json")
    assert _bounded(lambda: committed(str(ck))) == []
    got, why = _bounded(lambda: verify(str(ck / "step-00000004")))
    assert got is None and "not a plain file" in why and "\n" not in why


def test_a_fifo_in_the_capture_cache_is_a_miss(tmp_path, monkeypatch):
    from sapp.api import capture_graph, resolve_model
    from sapp.capture import cache
    monkeypatch.setenv("SAPP_CACHE_DIR", str(tmp_path))
    key = "a" * 32
    os.makedirs(cache.directory())
    os.mkfifo(cache._path(cache.directory(), key))
    assert _bounded(lambda: cache.load(key)) is None
    graph = capture_graph(resolve_model("gpt-tiny")[0])[0]
    assert _bounded(lambda: cache.store(key, graph, {"name": "gpt-tiny"}))      # replaced by the entry
    assert _bounded(lambda: cache.load(key)) is not None
