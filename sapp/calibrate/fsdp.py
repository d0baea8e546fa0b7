"""FSDP2's runtime cost besides its collectives: stacks of units sharded vs replicated."""
from __future__ import annotations

import time

FSDP_UNITS, FSDP_WIDTH = 4, 256


def _measure_fsdp(torch, dev, cfg, sync, procs):
    """Seconds per step of stacks of FSDP_UNITS units (each its own fully_shard unit, + root) with
    FSDP2 and replicated: units of one Linear (2 parameter tensors) and of Linear-LayerNorm-Linear
    (6 tensors, same bytes).  The differences, less the collectives, give FSDP2's runtime cost per
    unit and per parameter tensor (its copy-in/out and bookkeeping run tensor by tensor)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)

    def stack():
        return torch.nn.Sequential(*(torch.nn.Linear(FSDP_WIDTH, FSDP_WIDTH) for _ in range(FSDP_UNITS))).to(dev)

    def stack6():        # the same units holding 6 parameter tensors each instead of 2
        return torch.nn.Sequential(*(torch.nn.Sequential(
            torch.nn.Linear(FSDP_WIDTH, FSDP_WIDTH // 2), torch.nn.LayerNorm(FSDP_WIDTH // 2),
            torch.nn.Linear(FSDP_WIDTH // 2, FSDP_WIDTH)) for _ in range(FSDP_UNITS))).to(dev)

    x = torch.randn(8, FSDP_WIDTH, device=dev)
    mesh = init_device_mesh(dev.type, (procs,))

    def shard(m):
        for unit in m:
            fully_shard(unit, mesh=mesh)
        return fully_shard(m, mesh=mesh)

    out = {}
    for name, m in (("plain", stack()), ("fsdp", shard(stack())), ("plain6", stack6()), ("fsdp6", shard(stack6()))):
        def step():
            m.zero_grad(set_to_none=True)
            m(x).sum().backward()
        # every rank runs the same number of steps (collectives inside): a fixed count, best of 3
        step()
        sync()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(10):
                step()
            sync()
            best = min(best, (time.perf_counter() - t0) / 10)
        out[name] = best
    return out
