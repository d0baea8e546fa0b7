"""`sapp run` says one launch line (the torchrun command and torch's banners only with --verbose), and a
job stopped by SIGTERM or Ctrl-C ends with one line naming its last checkpoint, no traceback."""
import os
import signal
import subprocess
import sys
import time

import pytest

from sapp.commands.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("quiet") / "tiny.json"
    assert main(["search", "--model", "gpt-tiny", "--cluster", "cpu:nodes=1", "--out", str(path)]) == 0
    return str(path)


def _sapp(*argv, **kw):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("OMP_NUM_THREADS", None)
    return subprocess.Popen([sys.executable, "-m", "sapp.commands.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, **kw)


def test_one_launch_line_and_no_banner(plan):
    p = _sapp("run", plan, "--steps", "2")
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err[-2000:]
    launch = [ln for ln in out.splitlines() if "launching" in ln]
    assert len(launch) == 1 and "sapp.emit.runtime" not in launch[0] and "--verbose" in launch[0]
    assert "OMP_NUM_THREADS" not in err and "Traceback" not in err, err[-2000:]
    p = _sapp("run", plan, "--steps", "1", "--verbose")
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0 and "-m sapp.commands.run_worker" in out      # the torchrun command, as asked


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_job_says_one_line_with_its_last_checkpoint(plan, tmp_path, sig):
    ck = tmp_path / "ck"
    p = _sapp("run", plan, "--steps", "100000", "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
              start_new_session=True)
    deadline = time.time() + 150
    while time.time() < deadline and not any(n.startswith("step-") for n in (os.listdir(ck) if ck.exists() else [])):
        time.sleep(0.5)
    assert p.poll() is None, "the job ended before it could be stopped"
    # Ctrl-C reaches the whole foreground process group; SIGTERM only `sapp run`
    os.killpg(p.pid, sig) if sig == signal.SIGINT else p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert p.returncode == 130 and "Traceback" not in err, err[-3000:]
    last = [ln for ln in lines if "stopped by" in ln]
    assert len(last) == 1 and "the last checkpoint is step" in last[0] and "--resume" in last[0], err[-2000:]
    assert len(lines) <= 3, err          # the one line (and at most the ranks' own short notes)
