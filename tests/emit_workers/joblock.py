"""One multi-rank job at a time across the suite's pytest-xdist workers.

Each job already forks 2-8 gloo ranks that fill both CI cores; two jobs side by side only share the cores,
so each takes about twice as long against its own hard timeout (and its ranks' collective timeouts).  A job
instead waits for the other's end while its worker runs nothing; the ranks keep the cores busy meanwhile.
The lock is an flock on a file named by the xdist run's id (distinct between concurrent suites); a serial
run (`-n 0`) takes no lock."""
import contextlib
import fcntl
import os
import subprocess
import tempfile


def run(cmd, **kw):
    """subprocess.run(cmd, **kw) while holding the run's job lock: `timeout` counts from the job's start,
    not from the wait."""
    with held():
        return subprocess.run(cmd, **kw)


@contextlib.contextmanager
def held():
    """The run's job lock, for jobs launched by bench/ helpers (truth_matrix.run_jobs, time_truth.run)."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not uid:
        yield
        return
    with open(os.path.join(tempfile.gettempdir(), f"sapp-tests-{uid}.jobs.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
