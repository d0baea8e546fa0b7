"""The run's step log: rank 0's `[rank 0] step` lines in a pipe (no other rank prints steps), a progress
bar (and no step lines) on a terminal, JSON lines appended by every rank to its own file."""
import io
import json

import torch

from sapp.emit.runtime.train_log import StepLog


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_pipe_gets_lines_terminal_gets_a_bar(tmp_path):
    pipe = io.StringIO()
    log = StepLog(0, 4, 8, torch.device("cpu"), stream=pipe)
    log.step(0, 2.5, 0.01)
    log.close()
    assert pipe.getvalue() == "[rank 0] step 0 loss 2.500000 (10.0 ms)\n"
    pipe = io.StringIO()
    log = StepLog(1, 4, 8, torch.device("cpu"), json_path=str(tmp_path / "l.jsonl"), stream=pipe)
    log.step(0, 2.5, 0.01)
    log.close()
    assert pipe.getvalue() == ""                          # only rank 0 prints steps: lines never collide
    assert not (tmp_path / "l.jsonl").exists()            # rank 1 logs to its own file
    rec = json.loads((tmp_path / "l.rank1.jsonl").read_text())
    assert rec["rank"] == 1 and rec["step"] == 0 and rec["loss"] == 2.5 and rec["samples_per_s"] == 800.0
    tty = _Tty()
    log = StepLog(0, 4, 8, torch.device("cpu"), json_path=str(tmp_path / "l.jsonl"), stream=tty, start=0)
    for i in range(4):
        log.step(i, 2.0 - i / 10, 0.02)
    log.close()
    out = tty.getvalue()
    assert "training" in out and "4/4" in out and "[rank 0] step" not in out
    recs = [json.loads(x) for x in (tmp_path / "l.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 1, 2, 3] and recs[0]["samples_per_s"] == 400.0 and recs[0]["rank"] == 0
    assert recs[0]["peak_memory_kind"] == "process_rss" and recs[0]["peak_memory_bytes"] > 0


def test_a_failing_rank_logs_its_error_as_json(tmp_path):
    from sapp.emit.runtime.train_log import log_error, rank_path
    path = str(tmp_path / "train.jsonl")
    assert rank_path(path, 0) == path and rank_path(path, 3) == str(tmp_path / "train.rank3.jsonl")
    log_error(path, 3, 7, "RuntimeError: peer closed")
    log_error(None, 3, 7, "no log asked for: nothing written")
    rec = json.loads((tmp_path / "train.rank3.jsonl").read_text())
    assert (rec["rank"], rec["event"], rec["step"], rec["error"]) == (3, "error", 7, "RuntimeError: peer closed")
