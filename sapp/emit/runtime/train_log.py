"""What a `sapp run` rank reports per step.  Rank 0 alone prints steps (the other ranks' lines would
collide with its own; they print only errors): a `[rank 0] step i loss x (t ms)` line in a pipe or CI
log, a progress bar instead on a terminal.  With --log-json PATH every rank appends one JSON object per
step to its own file (rank 0: PATH, rank r: PATH with `.rank<r>` before the extension; appended, so a
restarted run continues the same files):

    {"rank": 0, "step": 3, "loss": 5.41, "step_time_s": 0.031, "samples_per_s": 258.1,
     "peak_memory_bytes": ..., "peak_memory_kind": "cuda_allocated" | "process_rss", "time": <unix seconds>}

and a rank that fails appends {"rank": r, "event": "error", "step": i, "error": "<one line>", "time": ...}.
Peak memory is what is measurable: CUDA's allocator peak on a GPU, the process's peak resident set
on a CPU (the whole process, torch and Python included)."""
from __future__ import annotations

import json
import os
import sys
import time


def peak_memory(device) -> tuple:
    """(bytes, kind) or (None, None)."""
    import torch
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_allocated"
    try:
        import resource
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "process_rss"   # KiB on Linux
    except (ImportError, OSError):
        return None, None


def rank_path(path: str, rank: int) -> str:
    """Rank r's JSON log: `train.jsonl` for rank 0, `train.rank3.jsonl` for rank 3."""
    if rank == 0:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext}"


def log_error(path, rank: int, step, message: str) -> None:
    """Append a failing rank's error to its JSON log (best effort: the rank is about to exit)."""
    if not path:
        return
    try:
        with open(rank_path(path, rank), "a") as f:
            f.write(json.dumps({"rank": rank, "event": "error", "step": step, "error": message,
                                "time": time.time()}) + "\n")
    except OSError:
        pass


def log_event(path, rank: int, event: str, **fields) -> None:
    """Append one event (a re-plan, say) to a rank's JSON log."""
    if not path:
        return
    with open(rank_path(path, rank), "a") as f:
        f.write(json.dumps({"rank": rank, "event": event, **fields, "time": time.time()}) + "\n")


class StepLog:
    def __init__(self, rank: int, total_steps: int, global_batch: int, device, *, json_path=None, start=0,
                 stream=None):
        self.rank, self.b, self.device = rank, global_batch, device
        self.stream = stream or sys.stdout
        self.json = open(rank_path(json_path, rank), "a") if json_path else None
        tty = getattr(self.stream, "isatty", None)
        self.bar = None
        if rank == 0 and tty and tty():
            from ...report.progress import Progress
            self.bar = Progress(total=total_steps, label="training", stream=self.stream)
            self.bar.update(start)
        # rank 0 alone prints steps; on a terminal its bar replaces the lines
        self.quiet = rank != 0 or bool(tty and tty())

    def step(self, i: int, loss: float, seconds: float) -> None:
        if self.bar is not None:
            self.bar.update(1, note=f"step {i} loss {loss:.4f} {seconds * 1e3:.0f} ms")
        elif not self.quiet:
            print(f"[rank {self.rank}] step {i} loss {loss:.6f} ({seconds * 1e3:.1f} ms)", file=self.stream, flush=True)
        if self.json is not None:
            peak, kind = peak_memory(self.device)
            rec = {"rank": self.rank, "step": i, "loss": loss, "step_time_s": seconds,
                   "samples_per_s": self.b / seconds if seconds > 0 else None,
                   "peak_memory_bytes": peak, "peak_memory_kind": kind, "time": time.time()}
            self.json.write(json.dumps(rec) + "\n")
            self.json.flush()

    def note(self, text: str) -> None:
        """A line from rank 0 that must not tear the bar."""
        if self.rank != 0:
            return
        if self.bar is not None and self.bar._drawn:
            self.stream.write("\n")
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.json is not None:
            self.json.close()
