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
    dist.init_process_group(backend_for(device), timeout=timedelta(seconds=timeout_s), **kwargs)


def rank_world(rank=None, world=None) -> tuple:
    """(rank, world) from the arguments, else the process group, else the environment, else (0, 1)."""
    if rank is None:
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    if world is None:
        world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    return int(rank), int(world)
