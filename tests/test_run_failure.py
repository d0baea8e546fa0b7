"""`sapp run` when a rank raises: the first failing rank's exception with its last frames, printed
once, and one line for every other rank saying it stopped because of that one (sapp/emit/runtime/failure.py)
- not "a rank died or raised; its message is above" with each survivor guessing "another rank
probably died"."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory):
    import sapp
    import sapp.models as models
    from sapp.api import search
    m = models.get("gpt-tiny", device="meta", dropout=0.0)
    plan = search(m, sapp.Cluster.parse("cpu:gpus=2"), global_batch=8, constraints={"dp": 2})
    path = tmp_path_factory.mktemp("fail") / "plan.json"
    plan.save(path)
    return path


def test_a_raising_rank_is_reported_once_with_its_frames(plan_path):
    p = subprocess.run([sys.executable, "-m", "sapp.commands.cli", "run", str(plan_path), "--model", "gpt-tiny", "--steps", "6"],
                       cwd=ROOT, capture_output=True, text=True, timeout=150,
                       env=dict(os.environ, SAPP_FAULT="1:2:raise"))
    err = p.stderr
    assert p.returncode != 0
    assert ("sapp run: error: training failed (exit code 1): rank 1 failed at step 2: RuntimeError: SAPP_FAULT: "
            "planted error at step 2") in err, err[-3000:]
    assert err.count("in _planted_fault") == 1, err[-3000:]            # the frames, once
    assert "sapp run:   RuntimeError: SAPP_FAULT: planted error at step 2" in err
    # the survivor says why it stopped, once in its own log and once in the report (unless the
    # launcher ended it first, as it watches its children: then it recorded nothing)
    if "[rank 0] error at step 2" in err:
        assert "[rank 0] error at step 2: stopped because rank 1 failed" in err, err[-3000:]
        assert "sapp run: rank 0 stopped at step 2 because rank 1 failed" in err, err[-3000:]
    assert "its message is above" not in err and "another rank probably died" not in err


def test_report_without_a_raising_rank_says_so(tmp_path):
    """Only collective failures recorded (the failing rank was killed): each survivor's line, no
    claim that one of them was first."""
    import json
    from sapp.emit.runtime import failure
    (tmp_path / "rank0.json").write_text(json.dumps({"rank": 0, "step": 3, "type": "DistBackendError",
                                                     "message": "Connection closed by peer", "peer": True,
                                                     "frames": ""}))
    lines = failure.report(str(tmp_path))
    assert lines == ["rank 0 stopped at step 3: DistBackendError: Connection closed by peer (a collective failed: "
                     "another rank died or stalled without raising)"]
    assert failure.report(str(tmp_path / "none")) == []
