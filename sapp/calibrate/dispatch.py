"""Per-operator dispatch: a chain of tiny ops (plain and on a sharded DTensor parameter)."""
from __future__ import annotations

from .machine import _timeit


LAUNCH_CHAIN = 200      # tiny ops per timed chain: long enough that the loop and sum() are noise


def _measure_launch(torch, dev, cfg, sync):
    """Seconds of host dispatch per operator, forward and backward: a chain of LAUNCH_CHAIN tiny
    multiplications on a 16-element tensor that requires grad (the arithmetic is ~nothing, so the
    time is the framework's dispatch + autograd recording + launch).  Backward is reported for the
    notes: the cost model charges it per gradient kernel at the forward rate."""
    w = torch.ones(16, device=dev, requires_grad=True)

    def fwd():
        h = w
        for _ in range(LAUNCH_CHAIN):
            h = h * 1.0
        return h

    def fwd_bwd():
        fwd().sum().backward()

    t_f = _timeit(fwd, cfg["min_time"] / 2, sync) / LAUNCH_CHAIN
    t_fb = _timeit(fwd_bwd, cfg["min_time"] / 2, sync) / LAUNCH_CHAIN
    return {"fwd": t_f, "bwd": max(0.0, t_fb - t_f)}


def _measure_sharded_launch(torch, dev, cfg, sync, procs):
    """Seconds per in-place op on a parameter sharded over all ranks (a DTensor, as FSDP2 and
    tensor parallelism hold them): what an optimizer update pays per op.  Pointwise on Shard(0) with
    a scalar: no communication, only the tensor-subclass dispatch."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh(dev.type, (procs,))
    p = distribute_tensor(torch.ones(16 * procs, device=dev), mesh, [Shard(0)])
    chain = LAUNCH_CHAIN // 4

    def step():
        with torch.no_grad():
            for _ in range(chain):
                p.mul_(1.0)

    return _timeit(step, cfg["min_time"] / 2, sync) / chain
