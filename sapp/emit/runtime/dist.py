"""Process-group set-up for emitted programs: backend choice and a short timeout so a dead rank ends
the job quickly instead of leaving the others blocked in a collective for torch's default 10-30 min."""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

# A collective waiting longer than this raises on the surviving ranks; torchrun then ends the job.
DEFAULT_TIMEOUT_S = 20.0


def default_device() -> torch.device:
    """cuda:<local rank> when CUDA is usable, else cpu (torch.accelerator is None on CPU boxes)."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init(device=None, timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs) -> None:
    """init_process_group from the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT) unless
    already initialised.  Extra kwargs (init_method, rank, world_size) pass through."""
    if dist.is_initialized():
        return
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if os.environ.get("SAPP_BIND_STORE") == "1" and "MASTER_ADDR" in os.environ and not kwargs:
        kwargs = dict(store=_bound_store(timedelta(seconds=timeout_s)), rank=int(os.environ["RANK"]),
                      world_size=int(os.environ["WORLD_SIZE"]))
    dist.init_process_group(backend_for(device), timeout=timedelta(seconds=timeout_s), **kwargs)
    _SETUP["timeout_s"] = timeout_s


_SETUP = {"timeout_s": DEFAULT_TIMEOUT_S}


def slow_group(timeout_s: float):
    """A gloo group of every rank for collectives that may wait long (a checkpoint's writes, rank 0's
    re-plan search), its own set-up under the job's short timeout: new_group waits in the store for
    every rank, and a rank that died before joining it (a node lost as its group formed) must end the
    others in seconds, not after `timeout_s` (they restart and re-form the group without it).  A peer
    that dies later breaks its connections, which fails the collective at once."""
    try:
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=_SETUP["timeout_s"]))
    except RuntimeError as e:        # DistStoreError: a rank never wrote its address
        from ...errors import SappError
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
        raise SappError(f"a rank did not join the group set-up within {_SETUP['timeout_s']:g} s (it died or stalled "
                        f"as the group formed; {type(e).__name__}: {first[:120]})") from None
    dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeout_s), group)
    return group


def _bound_store(timeout):
    """The TCPStore init_process_group would make from MASTER_ADDR/PORT, but rank 0's listens on
    MASTER_ADDR only, not on every interface (`sapp run` sets it: 127.0.0.1 on one node)."""
    return bound_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["RANK"]),
                       int(os.environ["WORLD_SIZE"]), timeout)


def bound_store(addr: str, port: int, rank: int, world: int, timeout):
    """A TCPStore whose server (rank 0's) listens on `addr` only: torch's own listens on every
    interface whatever address it is given.  Also `sapp calibrate`'s ranks (on 127.0.0.1)."""
    from .launch import bound_listener
    if rank != 0:
        return dist.TCPStore(addr, port, world, False, timeout=timeout)
    sock = bound_listener(addr, port)
    if sock is None:
        from ...errors import SappError
        raise SappError(f"rank 0 cannot listen on {addr}:{port} (not an address of this machine, "
                        "or the port is taken)")
    _LISTENERS.append(sock)          # the store serves on this socket's fd for the job's life
    return dist.TCPStore(addr, port, world, True, timeout=timeout, master_listen_fd=sock.fileno())


_LISTENERS = []


def rank_world(rank=None, world=None) -> tuple:
    """(rank, world) from the arguments, else the process group, else the environment, else (0, 1)."""
    if rank is None:
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    if world is None:
        world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    return int(rank), int(world)
