"""Host tables under data parallelism (2 gloo ranks, one spawned job: ~5 s idle, up to ~25 s on a
loaded 2-core CI; worth it because it is the only check that sparse host gradients are averaged
across replicas exactly as DDP averages the dense ones): dense parameters in DDP,
host tables kept out of DDP and their sparse gradients averaged by sync_host_grads.  After the steps
every parameter equals single-process training on the full batch."""
import multiprocessing as mp
import os
import tempfile

import pytest
import torch

import sapp.models as models
from sapp.emit.host import host

SECTION = {"groups": {"deep_emb.weight": {"weights": "host", "grads": "host", "optimizer": "host",
                                          "optimizer_kind": "sparse_adam"},
                      "wide_emb.weight": {"weights": "host", "grads": "host", "optimizer": "host",
                                          "optimizer_kind": "ftrl"}}, "predicted": {}}
STEPS, BATCH = 4, 16


def _batch(m, i):
    g = torch.Generator().manual_seed(100 + i)
    c = m.sapp_spec.config
    ids = torch.randint(0, c["rows_per_field"], (BATCH, c["fields"]), generator=g)
    return torch.randn(BATCH, c["dense"], generator=g), ids, (torch.rand(BATCH, generator=g) > 0.5).float()


def _build():
    torch.manual_seed(0)
    m = models.get("wide-deep-tiny", device="cpu")
    host.apply_placement(m, SECTION, "cpu")
    return m


def _worker(rank, world, store, out):
    code = 0
    try:
        import torch.distributed as dist
        from datetime import timedelta
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=20))
        m = _build()
        names = host.ignore_host_params_in_ddp(m, SECTION)
        ddp = torch.nn.parallel.DistributedDataParallel(m)
        opts = host.build_optimizers(ddp, SECTION, 1e-2)
        lf = models.loss_fn(m)
        for i in range(STEPS):
            x, ids, y = _batch(m, i)
            sl = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
            for o in opts:
                o.zero_grad(set_to_none=True)
            lf(ddp(x[sl], ids[sl]), y[sl]).backward()
            host.sync_host_grads(ddp, SECTION)
            for o in opts:
                o.step()
        if rank == 0:
            torch.save({"names": names, "state": {k: v.detach() for k, v in m.state_dict().items()}}, out)
        dist.barrier()
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    os._exit(code)


def test_host_tables_with_ddp_match_single_process():
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as d:
        store, out = os.path.join(d, "store"), os.path.join(d, "out.pt")
        procs = [ctx.Process(target=_worker, args=(r, 2, store, out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=90)
        for p in procs:
            if p.is_alive():
                p.kill()
                pytest.fail("gloo worker hung")
        assert all(p.exitcode == 0 for p in procs)
        got = torch.load(out)
    assert got["names"] == ["deep_emb.weight", "wide_emb.weight"]
    m = _build()
    opts = host.build_optimizers(m, SECTION, 1e-2)
    lf = models.loss_fn(m)
    for i in range(STEPS):
        x, ids, y = _batch(m, i)
        for o in opts:
            o.zero_grad(set_to_none=True)
        lf(m(x, ids), y).backward()
        for o in opts:
            o.step()
    for k, v in m.state_dict().items():
        torch.testing.assert_close(got["state"][k], v, atol=1e-5, rtol=1e-4, msg=k)
