"""The run's step log: plain `[rank r] step` lines in a pipe, a progress bar (and no step lines) on a
terminal, JSON lines appended by rank 0 only."""
import io
import json

import torch

from sapp.emit.train_log import StepLog


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_pipe_gets_lines_terminal_gets_a_bar(tmp_path):
    pipe = io.StringIO()
    log = StepLog(1, 4, 8, torch.device("cpu"), json_path=str(tmp_path / "l.jsonl"), stream=pipe)
    log.step(0, 2.5, 0.01)
    log.close()
    assert pipe.getvalue() == "[rank 1] step 0 loss 2.500000 (10.0 ms)\n"
    assert not (tmp_path / "l.jsonl").exists()            # rank 0 writes the JSON log
    tty = _Tty()
    log = StepLog(0, 4, 8, torch.device("cpu"), json_path=str(tmp_path / "l.jsonl"), stream=tty, start=0)
    for i in range(4):
        log.step(i, 2.0 - i / 10, 0.02)
    log.close()
    out = tty.getvalue()
    assert "training" in out and "4/4" in out and "[rank 0] step" not in out
    recs = [json.loads(x) for x in (tmp_path / "l.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 1, 2, 3] and recs[0]["samples_per_s"] == 400.0
    assert recs[0]["peak_memory_kind"] == "process_rss" and recs[0]["peak_memory_bytes"] > 0
