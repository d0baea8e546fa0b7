"""torchrun for `sapp run` (python -m sapp.emit.runtime.launch TORCHRUN-ARGS...): torch.distributed.run with a
rendezvous backend, "sapp-c10d", whose TCPStore listens on one address instead of every interface.

torch's c10d rendezvous store and the store rank 0 hosts for init_process_group bind the wildcard
address, so anyone who can reach the machine can talk to them (they have no authentication).  Here
the rendezvous store listens on the --rdzv-endpoint address only (127.0.0.1 for a single-node run),
and the workers' store on MASTER_ADDR (sapp/emit/runtime/dist.py, asked for by SAPP_BIND_STORE=1), which
`sapp run` sets with --local-addr.  Otherwise it is torch's own dynamic rendezvous over the same
store.  A rendezvous that times out (a node never joined) ends in one line naming the missing node
ranks: every agent writes `sapp/node/<its --node-rank>` into the store when it joins (SAPP_NODE_RANK),
and while it waits the agent names them every few seconds.  `sapp run` refuses a multi-node job
without --rdzv-endpoint (torchrun's static rendezvous would listen on [::]:29500)."""
from __future__ import annotations

import errno
import os
import socket
import sys
from datetime import timedelta

BACKEND = "sapp-c10d"
TIMEOUT_EXIT = 3          # exit codes after which `sapp run` adds nothing: the line is already said
FAILED_EXIT = 4
_state = {}


def bound_listener(host: str, port: int):
    """A listening socket on `host`'s address (not the wildcard), or None when this machine does not
    have that address or another process here already listens on it (then it is a client)."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror:
        return None
    s = socket.socket(family, kind, proto)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(addr)
        s.listen(128)
    except OSError as e:
        s.close()
        if e.errno in (errno.EADDRNOTAVAIL, errno.EADDRINUSE):
            return None
        raise
    return s


def _create_handler(params):
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)
    timeout = timedelta(seconds=int(params.get_as_int("read_timeout", 60)))
    join_s = params.get_as_int("join_timeout", 600)
    _state.update(endpoint=f"{host}:{port}", nodes=params.max_nodes, join_s=join_s)
    sock = bound_listener(host, port) if params.get_as_bool("is_host") is not False else None
    if sock is not None:
        _state["listener"] = sock          # the store keeps using the fd: keep the socket alive
        store = TCPStore(host, sock.getsockname()[1], is_master=True, timeout=timeout, master_listen_fd=sock.fileno())
    else:
        try:     # a node before node 0 waits --rdzv-timeout for it, not the store's 60 s read timeout
            store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=join_s))
        except RuntimeError:          # torch's DistNetworkError / DistStoreError: said in one line by main
            raise RendezvousConnectionError(f"nothing answered within --rdzv-timeout {join_s} s") from None
        store.set_timeout(timeout)
    node = os.environ.get("SAPP_NODE_RANK")
    if node is not None:
        store.set(f"sapp/node/{node}", socket.gethostname())
    _state["store"] = store
    class Backend(C10dRendezvousBackend):      # torch checks the handler's name against --rdzv-backend
        @property
        def name(self) -> str:
            return BACKEND
    return _with_progress(create_handler(store, Backend(store, params.run_id), params))


def _with_progress(handler):
    """While the agent waits in a rendezvous, say every few seconds (a fifth of --rdzv-timeout, 1 to
    10 s) which nodes have not joined: a node that waits silently for 600 s looks hung."""
    inner = handler.next_rendezvous

    def next_rendezvous(*args, **kwargs):
        import threading
        import time
        done, t0, join_s = threading.Event(), time.monotonic(), float(_state.get("join_s") or 600)

        def report():
            while not done.wait(min(10.0, max(1.0, join_s / 5))):
                joined, missing, n = _who()
                if not missing:     # every node has been seen: the rest is torch's own last call
                    continue
                print(f"sapp run: waiting for the rendezvous at {_state.get('endpoint')}: node"
                      f"{'s' if len(missing) > 1 else ''} {', '.join(missing)} of {n} not joined yet (joined: "
                      f"{', '.join(joined) or 'none'}); {time.monotonic() - t0:.0f} of {join_s:.0f} s",
                      file=sys.stderr, flush=True)
        threading.Thread(target=report, name="sapp-rdzv-progress", daemon=True).start()
        try:
            return inner(*args, **kwargs)
        finally:
            done.set()
    handler.next_rendezvous = next_rendezvous
    return handler


def _who():
    """(joined as 'rank (host)', missing ranks, node count) from the keys every agent writes on joining."""
    store, n = _state.get("store"), int(_state.get("nodes") or 0)
    joined, missing = [], []
    for r in range(n):
        try:
            (joined.append(f"{r} ({store.get(f'sapp/node/{r}').decode()})") if store is not None
             and store.check([f"sapp/node/{r}"]) else missing.append(str(r)))
        except Exception:        # noqa: BLE001 - the store went away with the host
            missing.append(str(r))
    return joined, missing, n


def timeout_line() -> str:
    """The rendezvous ran out of time: which node ranks never wrote their key."""
    joined, missing, n = _who()
    who = (f"node{'s' if len(missing) > 1 else ''} {', '.join(missing)} of {n} never joined" if missing
           else f"not all {n} nodes joined")
    return (f"sapp run: error: {who} the rendezvous at {_state.get('endpoint')} within {_state.get('join_s')} s "
            f"(joined: {', '.join(joined) or 'none'}); start `sapp run ... --node-rank "
            f"{missing[0] if missing else 'N'}` there or check --rdzv-endpoint, --nnodes and the network")


def main(argv=None) -> int:
    from .lifeline import PARENT_ENV, bind_to_parent
    bind_to_parent("the launcher")              # before torch's import: `sapp run` may be gone already
    os.environ[PARENT_ENV] = str(os.getpid())   # torch's agent hands its environment to every worker
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousTimeoutError
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    rendezvous_handler_registry.register(BACKEND, _create_handler)
    try:
        run.main(argv)
    except SignalException as e:        # Ctrl-C / SIGTERM: the workers are stopped; `sapp run` says so in one line
        return 128 + int(e.sigval)
    except KeyboardInterrupt:
        return 130
    except ChildFailedError as e:       # torchrun would print its own traceback around the summary
        codes = {f.exitcode for f in e.failures.values()}
        if 2 in codes and codes <= {2, -15}:     # a SappError, said in one line by the rank (the rest stopped)
            return FAILED_EXIT
        fail_dir = os.environ.get("SAPP_FAIL_DIR")
        if fail_dir:
            from . import failure
            if failure.report(fail_dir):         # a rank recorded its exception: `sapp run` prints it once
                return max((c for c in codes if c > 0), default=1)
        how = [f"rank {r} " + (f"ended by {f.signal_name()}" if f.exitcode < 0 else f"exited with code {f.exitcode}")
               for r, f in sorted(e.failures.items())]
        print(f"sapp run: error: training failed ({', '.join(how)}): a rank died or raised; its message is above",
              file=sys.stderr, flush=True)
        return FAILED_EXIT
    except RendezvousTimeoutError:
        print(timeout_line(), file=sys.stderr, flush=True)
        return TIMEOUT_EXIT
    except RendezvousConnectionError as e:
        cause = e.__cause__ or e
        why = f"({type(cause).__name__}: {str(cause).strip().splitlines()[0][:160] if str(cause).strip() else ''})"
        if _state.get("store") is not None:     # reached when the job started: the node hosting it is gone
            print(f"sapp run: error: lost the rendezvous store at {_state.get('endpoint')} {why}: the node that hosts "
                  "it (the first to bind --rdzv-endpoint) is gone; start the job again (--elastic resumes its last "
                  "checkpoint)", file=sys.stderr, flush=True)
            return TIMEOUT_EXIT
        print(f"sapp run: error: cannot reach the rendezvous store at {_state.get('endpoint', '--rdzv-endpoint')} "
              f"{why}; start node 0 first or check --rdzv-endpoint", file=sys.stderr, flush=True)
        return TIMEOUT_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
