"""Commands that can take over 5 s show progress (issue 55 item 6): a bar redrawn on a terminal,
whole lines at a period in a log (sapp/report/progress.py's log_every), from a ticking thread where
the long call reports nothing itself (import's comparison, replan, calibrate)."""
import io
import time

import pytest

import sapp.report.progress as progress_mod
from sapp.commands.cli import main
from sapp.report.progress import Progress


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_log_mode_writes_whole_lines_at_a_period():
    s = io.StringIO()
    with Progress(label="replan", counts=False, stream=s, log_every=0.05) as p:
        p.status("re-planning")
        p.ticking(0.01)
        time.sleep(0.3)
    lines = s.getvalue().splitlines()
    assert "\r" not in s.getvalue() and s.getvalue().endswith("\n")
    assert lines[0].startswith("replan: ") and "re-planning" in lines[0]
    assert 3 <= len(lines) <= 8                       # about every 0.05 s over 0.3 s, not every tick
    quiet = io.StringIO()
    with Progress(label="search", stream=quiet) as p:      # without log_every: silent off a terminal
        p.status("x")
        p.ticking(0.01)
        time.sleep(0.05)
    assert quiet.getvalue() == ""


def test_terminal_bar_moves_while_a_call_runs():
    t = Tty()
    with Progress(label="calibrate", counts=False, stream=t, min_interval=0, log_every=10) as p:
        p.status("measuring")
        p.ticking(0.01)
        time.sleep(0.1)
    out = t.getvalue()
    assert out.count("\r\x1b[K") >= 3 and "calibrate: " in out and out.endswith("\n")
    assert "\n" not in out[:-1]                       # one line redrawn, not lines


@pytest.fixture
def fast_log(monkeypatch):
    monkeypatch.setattr(progress_mod, "LOG_EVERY", 0.0)   # a line per tick: the test need not wait 10 s


def test_replan_shows_progress(tmp_path, capsys, fast_log):
    plan = tmp_path / "p.json"
    assert main(["search", "--model", "gpt-small", "--cluster", "a100-80g:nodes=2", "--batch", "16",
                 "--out", str(plan)]) == 0
    capsys.readouterr()
    assert main(["replan", str(plan), "--nodes", "1"]) == 0
    err = capsys.readouterr().err
    assert "replan: " in err and "re-planning gpt-small for 8 devices" in err


def test_import_comparison_shows_progress(tmp_path, capsys, fast_log):
    plan, args_path = str(tmp_path / "p.json"), str(tmp_path / "p.args")
    assert main(["search", "--model", "gpt-tiny", "--cluster", "a100-80g:devices=8", "--target", "megatron",
                 "--batch", "8", "--out", plan]) == 0
    assert main(["export", plan, "--to", "megatron", "--out", args_path]) == 0
    capsys.readouterr()
    assert main(["import", "--from", "megatron", args_path, "--model", "gpt-tiny", "--cluster",
                 "a100-80g:devices=8"]) == 0
    err = capsys.readouterr().err
    assert "import: " in err and "comparing: searching the best plan megatron can state" in err


def test_calibrate_shows_progress(tmp_path, capsys, fast_log, monkeypatch):
    import sapp.calibrate as cal
    from sapp.cluster import Cluster

    def slow(**kw):                 # the measurement itself: tests/test_calibrate.py runs it
        time.sleep(0.7)            # past one tick of the 0.5 s ticker
        return Cluster.parse("cpu:gpus=2"), {}
    monkeypatch.setattr(cal, "calibrate", slow)
    assert main(["calibrate", "--quick", "--out", str(tmp_path / "me.json")]) == 0
    err = capsys.readouterr().err
    assert "calibrate: " in err and "measuring kernels, memory and collectives in 2 process(es) (quick)" in err
    assert err.count("calibrate: ") >= 2              # the status, then lines while it measures
