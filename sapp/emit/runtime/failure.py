"""What `sapp run` says when a rank fails: the first failing rank's exception with its last frames,
once, and for every other rank one line saying it stopped because of that one.

A rank that raises writes a record (rank, step, exception, its last frames, whether it is a peer's
collective failure) to the directory `sapp run` names in SAPP_FAIL_DIR and claims `first` there
(an exclusive create) unless its error is a failed collective: the rank whose own code raised
claims it before its exit closes the connections the others then fail on.  `sapp run` reads the
records after the job ends (`report`).  Without SAPP_FAIL_DIR (a bare torchrun launch) a rank
prints its own frames."""
from __future__ import annotations

import json
import os
import traceback

FRAMES = 6
# a collective that failed because another process went away or stalled (gloo / NCCL wording)
_PEER = ("connection closed", "connection reset", "broken pipe", "timed out", "timeout", "connectfullmesh",
         "peer", "ncclremoteerror", "nccl error", "socket", "gloo")


def is_peer_failure(e: BaseException) -> bool:
    if type(e).__name__ in ("DistBackendError", "DistNetworkError", "DistStoreError"):
        return True
    text = f"{type(e).__name__}: {e}".lower()
    return any(w in text for w in _PEER)


def frames(e: BaseException, n: int = FRAMES) -> str:
    """The exception's last `n` frames and its message, as Python prints them."""
    tb = traceback.extract_tb(e.__traceback__)[-n:]
    lines = traceback.format_list(tb) + traceback.format_exception_only(type(e), e)
    return "".join(lines).rstrip()


def record(rank: int, step: int, e: BaseException) -> tuple:
    """Write this rank's record; returns (is this the first failure, the failing rank's number or None)."""
    where = os.environ.get("SAPP_FAIL_DIR")
    peer = is_peer_failure(e)
    msg = str(e).strip().splitlines()
    rec = {"rank": rank, "step": step, "type": type(e).__name__, "message": msg[0] if msg else "",
           "peer": peer, "frames": frames(e)}
    if not where or not os.path.isdir(where):
        return not peer, None
    first = False
    if not peer:
        try:
            fd = os.open(os.path.join(where, "first"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.write(fd, str(rank).encode())
            os.close(fd)
            first = True
        except FileExistsError:
            pass
    with open(os.path.join(where, f"rank{rank}.json"), "w") as f:
        json.dump(rec, f)
    culprit = None
    try:
        with open(os.path.join(where, "first")) as f:
            culprit = int(f.read().strip() or -1)
    except (OSError, ValueError):
        pass
    return first, culprit


def report(where: str) -> list:
    """Lines for `sapp run` after a failed job: the first failing rank's exception and frames, then one
    line per other rank that recorded an error.  [] when no rank recorded one (killed or exited)."""
    recs = {}
    for name in sorted(os.listdir(where)) if os.path.isdir(where) else ():
        if name.startswith("rank") and name.endswith(".json"):
            try:
                with open(os.path.join(where, name)) as f:
                    r = json.load(f)
                recs[int(r["rank"])] = r
            except (OSError, ValueError, KeyError):
                continue
    if not recs:
        return []
    first = None
    try:
        with open(os.path.join(where, "first")) as f:
            first = int(f.read().strip())
    except (OSError, ValueError):
        pass
    if first not in recs:
        return [f"rank {r} stopped at step {v['step']}: {v['type']}: {v['message']} (a collective failed: another "
                f"rank died or stalled without raising)" for r, v in sorted(recs.items())]
    f = recs[first]
    out = [f"rank {first} failed at step {f['step']}: {f['type']}: {f['message']}", "last frames:"]
    out += ["  " + line for line in f["frames"].splitlines()]
    out += [f"rank {r} stopped at step {v['step']} because rank {first} failed" for r, v in sorted(recs.items())
            if r != first]
    return out
