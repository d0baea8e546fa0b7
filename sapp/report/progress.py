"""A tiny progress line for long searches.

    with Progress(total=len(candidates), label="joint search") as prog:
        for c in candidates:
            ...
            prog.update(1, note=f"best {best:.3g} s")

or pass it as a callback: `joint_search(..., progress=prog)` calls `prog(done, total, note)`.
`status(text)` draws a line at once (before any count: "search: capturing gpt3-175b ... 0.3s").

It draws on a terminal (a line redrawn in place), redraws at most every `min_interval` seconds so it
never costs search time, and `close()` leaves the line clean even when the loop is left by
KeyboardInterrupt (use it as a context manager or in `finally`).  Off a terminal (a CI log, a pipe) it
is silent unless `log_every` is set: then a whole line is written at each `status` and at most every
`log_every` seconds, so a log shows the work going on without a line per update.  `ticking()` redraws
from a thread while one long call runs that reports nothing itself (a calibration, a re-plan)."""
from __future__ import annotations

import sys
import threading
import time

# seconds between two lines in a log (commands that can take over 5 s pass it as log_every)
LOG_EVERY = 10.0


class Progress:
    def __init__(self, total=None, label="", stream=None, *, min_interval=0.1, enabled=None, counts=True,
                 log_every=None):
        self.total = total if (total is None or total > 0) else None
        self.counts = counts          # False: the bar and its percentage only (done/total are not units)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.count = 0
        self.note = ""
        self.min_interval = min_interval
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        # off a terminal, whole lines (no \r redraws a log would keep) at this period, if asked for
        self.log_every = None if enabled or log_every is None else float(log_every)
        self._last_log = time.monotonic()     # the first periodic line after log_every, not at once
        self._ticker = None
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._drawn = False
        self._closed = False

    # ---- public ---------------------------------------------------------------------------------
    def update(self, n=1, note=None, total=None):
        """Advance by `n` (may be 0 to change the note or the total only)."""
        if total is not None and total > 0:
            self.total = total
        self.count += n
        if note is not None:
            self.note = str(note)
        if self._closed:
            return
        now = time.monotonic()
        if not self.enabled:
            self._log(now)
        elif now - self._last_draw >= self.min_interval or (self.total and self.count >= self.total):
            self._draw(now)

    def status(self, text):
        """Say what is happening now (drawn immediately, not throttled; a line of its own in a log)."""
        self.note = str(text)
        if self._closed:
            return
        if self.enabled:
            self._draw(time.monotonic())
        elif self.log_every is not None:
            self._log(time.monotonic(), force=True)

    def ticking(self, every=0.5):
        """Redraw (a terminal) or log (`log_every`) from a thread until close(): the elapsed time moves
        while a call that reports no progress of its own runs.  Returns self."""
        if self._ticker is None and (self.enabled or self.log_every is not None):
            stop = threading.Event()

            def tick():
                while not stop.wait(every):
                    self.update(0)
            self._ticker = (stop, threading.Thread(target=tick, name="sapp-progress", daemon=True))
            self._ticker[1].start()
        return self

    def __call__(self, done, total=None, note=None):
        """Callback form: `progress(done, total)` sets the absolute count (what joint_search calls)."""
        self.update(done - self.count, note=note, total=total)

    def close(self):
        if self._closed:
            return
        self._closed = True
        if self._ticker is not None:
            self._ticker[0].set()
            self._ticker[1].join(timeout=1.0)
        if self.enabled and self._drawn:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def line(self) -> str:
        """The text drawn (also useful in tests)."""
        elapsed = time.monotonic() - self._start
        head = f"{self.label}: " if self.label else ""
        if self.total:
            frac = min(self.count / self.total, 1.0)
            width = 20
            bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
            body = f"[{bar}] " + (f"{self.count}/{self.total} " if self.counts else "") + f"{frac * 100:3.0f}%"
        elif self.count:
            body = f"{self.count} done"
        else:
            body = ""
        tail = f"{' ' if body else ''}{elapsed:.1f}s"
        if self.note:
            tail += f"  {self.note}"
        return head + body + tail

    # ---- internals ------------------------------------------------------------------------------
    def _log(self, now, force=False):
        if self.log_every is None:
            return
        if force or self._last_log is None or now - self._last_log >= self.log_every:
            self._last_log = now
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def _draw(self, now):
        self._last_draw = now
        self._drawn = True
        # \r + clear-to-end-of-line rewrites the same terminal line.
        self.stream.write("\r\x1b[K" + self.line())
        self.stream.flush()
