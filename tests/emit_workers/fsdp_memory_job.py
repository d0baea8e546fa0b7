"""What FSDP2 keeps, read by sapp/emit/runtime/memory_meter.py on 2 gloo ranks (tests/test_memory_rules.py).

    python -m tests.emit_workers.fsdp_memory_job OUT.json

A root with two Linear(64, 64) blocks and a Linear(64, 4) head, fully_shard per block and on the root
(the emitter's ZeRO-2 / ZeRO-3 layout, sapp/emit/dp/wrap.py).  Rank 0 writes the readings."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from types import SimpleNamespace

D = 64


def _model():
    import torch
    from torch import nn

    class Root(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(D, D), nn.Linear(D, D)])
            self.head = nn.Linear(D, 4)

        def forward(self, x):
            for b in self.blocks:
                x = torch.relu(b(x))
            return self.head(x).pow(2).mean()
    torch.manual_seed(0)
    return Root()


def _sharded(reshard):
    from torch.distributed.fsdp import fully_shard
    m = _model()
    for b in m.blocks:
        fully_shard(b, reshard_after_forward=reshard)
    fully_shard(m, reshard_after_forward=reshard)
    return m


def _worker(rank, world, out, store):
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    from sapp.emit.runtime.memory_meter import MemoryMeter
    torch.set_num_threads(1)
    res = {}
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=30))
        x = torch.randn(8, D)
        for name, reshard in (("zero2", False), ("zero3", True)):
            m = _sharded(reshard)
            meter = MemoryMeter(SimpleNamespace(modules=[m], optimizers=[], grad_hooks=[]))
            r = {"params": meter.params()}
            seen = []

            def unpack(t, meter=meter, seen=seen):
                seen.append(meter._unsharded_bytes())
                return t
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
                loss = m(x)
                r["gathered_after_forward"] = meter._unsharded_bytes()
                loss.backward()
            # block0's backward unpacks last: the root and block0 gathered then
            r["gathered_in_first_block_backward"] = seen[-1]
            r["gathered_in_backward_max"] = max(seen)
            res[name] = r
        # a host table: fully_shard(ignored_params=...) neither shards nor gathers it (sapp/emit/dp/wrap.py)
        from torch.distributed.fsdp import fully_shard
        m = _model()
        m.table = torch.nn.Embedding(100, D)
        for b in m.blocks:
            fully_shard(b, reshard_after_forward=False)
        fully_shard(m, reshard_after_forward=False, ignored_params={m.table.weight})
        meter = MemoryMeter(SimpleNamespace(modules=[m], optimizers=[], grad_hooks=[]))
        loss = m(x + m.table(torch.arange(8)))
        res["ignored"] = {"gathered_after_forward": meter._unsharded_bytes(),
                          "table_local_bytes": m.table.weight.numel() * 4 if type(m.table.weight).__name__ != "DTensor"
                          else m.table.weight.to_local().numel() * 4}
        loss.backward()
        m = _sharded(False)
        meter = MemoryMeter(SimpleNamespace(modules=[m], optimizers=[], grad_hooks=[]))
        m.set_requires_gradient_sync(False)
        m(x).backward()
        loss = m(x)
        res["accumulate"] = {"grads_second_forward": meter._grad_bytes(unsharded=True)}
        m.set_requires_gradient_sync(True)
        loss.backward()
        res["accumulate"]["grads_at_step"] = meter._grad_bytes(unsharded=True)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        res = {"error": traceback.format_exc()[-2000:]}
    if rank == 0 or "error" in res:
        with open(out if rank == 0 else out + f".{rank}", "w") as f:
            json.dump(res, f)
    sys.stdout.flush()
    os._exit(0)


def main(out):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(_worker, args=(2, out, os.path.join(tmp, "store")), nprocs=2, join=False,
                                 start_method="fork")
        while not ctx.join(timeout=150):
            pass


if __name__ == "__main__":
    main(sys.argv[1])
