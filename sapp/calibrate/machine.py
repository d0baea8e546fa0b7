"""Facts about this machine and the timing loop every measurement uses."""
from __future__ import annotations

import os
import socket
import time

from ..cluster import PRESETS


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _usable_cpus() -> int:
    """CPUs this process may run on (taskset / cgroup affinity), not all the machine has."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _total_ram():
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return PRESETS["cpu"].host_memory


# ---- measurements (run inside each worker) ------------------------------------------------------
def _timeit(fn, min_time, sync, rounds=3, stat=min):
    """Seconds per call: `rounds` rounds of repeats, each until `min_time / rounds` has passed;
    `stat` (min: the undisturbed rate; statistics.median: the typical one) over the rounds' means."""
    fn()
    sync()
    per = []
    for _ in range(rounds):
        reps, t0 = 0, time.perf_counter()
        while True:
            fn()
            reps += 1
            sync()
            el = time.perf_counter() - t0
            if el >= min_time / rounds:
                break
        per.append(el / reps)
    return stat(per)
