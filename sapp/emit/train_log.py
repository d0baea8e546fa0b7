"""What a `sapp run` rank reports per step: a `[rank r] step i loss x (t ms)` line (pipes, CI logs), or
on rank 0 a progress bar instead when stdout is a terminal; and rank 0 appends one JSON object per step
to --log-json (appended, so a restarted run continues the same file):

    {"step": 3, "loss": 5.41, "step_time_s": 0.031, "samples_per_s": 258.1, "peak_memory_bytes": ...,
     "peak_memory_kind": "cuda_allocated" | "process_rss", "time": <unix seconds>}

Peak memory is what is measurable: CUDA's allocator peak on a GPU, the process's peak resident set
on a CPU (the whole process, torch and Python included)."""
from __future__ import annotations

import json
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


class StepLog:
    def __init__(self, rank: int, total_steps: int, global_batch: int, device, *, json_path=None, start=0,
                 stream=None):
        self.rank, self.b, self.device = rank, global_batch, device
        self.stream = stream or sys.stdout
        self.json = open(json_path, "a") if (json_path and rank == 0) else None
        tty = getattr(self.stream, "isatty", None)
        self.bar = None
        if rank == 0 and tty and tty():
            from ..report.progress import Progress
            self.bar = Progress(total=total_steps, label="training", stream=self.stream)
            self.bar.update(start)
        # on a terminal the bar replaces every rank's step lines (they would tear it)
        self.quiet = bool(tty and tty())

    def step(self, i: int, loss: float, seconds: float) -> None:
        if self.bar is not None:
            self.bar.update(1, note=f"step {i} loss {loss:.4f} {seconds * 1e3:.0f} ms")
        elif not self.quiet:
            print(f"[rank {self.rank}] step {i} loss {loss:.6f} ({seconds * 1e3:.1f} ms)", file=self.stream, flush=True)
        if self.json is not None:
            peak, kind = peak_memory(self.device)
            rec = {"step": i, "loss": loss, "step_time_s": seconds,
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
