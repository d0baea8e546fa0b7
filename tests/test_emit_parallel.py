"""Unit checks of the data-parallel pieces (sapp/emit/dp/wrap.py) that run in one process (a world-1 gloo group)."""
import torch
import torch.distributed as dist
from torch import nn

from sapp.emit.dp import wrap


def test_adam_is_fused_for_plain_parameters():
    # one pass over p, g, m, v as the cost model prices it (28 B per fp32 parameter)
    opt = wrap.make_optimizer(nn.Linear(4, 4).parameters(), "adam", 1e-3, zero=0)
    assert opt.defaults.get("fused") is True
    sgd = wrap.make_optimizer(nn.Linear(4, 4).parameters(), "sgd", 1e-3, zero=0)
    assert not sgd.defaults.get("fused")


def test_flat_allreduce_reuses_its_buffer_and_averages(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        lin = nn.Linear(3, 2)
        sync = wrap.GradAllReduce(lin.parameters(), None, mixed=False)
        for step in range(2):
            lin.zero_grad(set_to_none=True)
            lin(torch.ones(1, 3)).sum().backward()
            before = [p.grad.clone() for p in lin.parameters()]
            sync()
            buf = sync._flat
            if step == 0:
                first = buf
            for p, g in zip(lin.parameters(), before):
                assert torch.equal(p.grad, g)          # mean over one rank: unchanged
        assert buf is first and buf.numel() == sum(p.numel() for p in lin.parameters())
        bf = wrap.GradAllReduce(lin.parameters(), None, mixed=True)
        bf()                                           # bf16 on the wire: close, not exact
        for p, g in zip(lin.parameters(), before):
            assert torch.allclose(p.grad, g, rtol=1e-2)
    finally:
        dist.destroy_process_group()
