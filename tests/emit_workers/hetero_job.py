"""Uneven data shares (sapp/emit/dp/hetero_data.py) on gloo: every rank trains its slice of each global
batch of a mixed-cluster plan, in float64; the parameters after the last step are written out.

    python -m tests.emit_workers.hetero_job PLAN.json OUT.json STEPS [unweighted]

`unweighted`: the plain data-parallel mean instead (each rank's mean loss, gradients averaged over
ranks), which uneven shares make wrong - the test shows it differs."""
from __future__ import annotations

import json
import os
import sys
import tempfile

D, H, LR = 6, 16, 0.1
LAYERS = 8


def model():
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, H), nn.LayerNorm(H), nn.GELU(), nn.Linear(H, 1)).double()


def batch(step, n):
    import torch
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(n, D, generator=g, dtype=torch.float64)
    return x, (x.sum(1, keepdim=True) ** 2).sin()


def factory():
    """`sapp run --model tests.emit_workers.hetero_job:factory`: the model, an example batch, targets and
    loss, in float64 (tests/test_hetero_run.py)."""
    import torch.nn.functional as F
    x, y = batch(0, 8)
    return model(), (x,), y, F.mse_loss


def deep(n_layers=LAYERS):
    """A float64 stack of identical residual blocks between an input and an output layer: what a
    pipeline over mixed groups cuts (tests/test_hetero_pipeline.py)."""
    import torch
    import torch.nn as nn

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(H, H)

        def forward(self, h):
            return h + torch.tanh(self.fc(h))

    class Deep(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(D, H)
            self.layers = nn.ModuleList(Layer() for _ in range(n_layers))
            self.out = nn.Linear(H, 1)

        def forward(self, x):
            h = self.inp(x)
            for layer in self.layers:
                h = layer(h)
            return self.out(h)

    torch.manual_seed(0)
    return Deep().double()


def deep_factory():
    """`sapp run --model tests.emit_workers.hetero_job:deep_factory`: the block stack, an example batch,
    targets and loss, in float64."""
    import torch.nn.functional as F
    x, y = batch(0, 8)
    return deep(), (x,), y, F.mse_loss


def _loss(m, x, y):
    return ((m(x) - y) ** 2).mean()


def reference(gb, steps):
    """One process on the whole global batch."""
    import torch
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    for s in range(steps):
        opt.zero_grad()
        _loss(m, *batch(s, gb)).backward()
        opt.step()
    return [p.detach().reshape(-1).tolist() for p in m.parameters()]


def _rank(rank, world, doc, steps, init, out, unweighted):
    import torch
    import torch.distributed as dist
    from sapp.emit.dp.hetero_data import for_rank
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    gb = doc["model"]["global_batch"]
    (start, stop), sync = for_rank(doc, rank, list(m.parameters()))
    for s in range(steps):
        opt.zero_grad()
        x, y = batch(s, gb)
        if stop > start:
            _loss(m, x[start:stop], y[start:stop]).backward()
        if unweighted:
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                              for p in m.parameters()])
            dist.all_reduce(flat)
            flat /= world
            off = 0
            for p in m.parameters():
                p.grad = flat[off:off + p.numel()].view_as(p).clone()
                off += p.numel()
        else:
            sync()
        opt.step()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"params": [p.detach().reshape(-1).tolist() for p in m.parameters()],
                       "slices": [list(map(int, (start, stop)))]}, f)
    dist.destroy_process_group()


def main(argv):
    import torch.multiprocessing as mp
    from sapp.emit.dp.hetero_data import rank_slices
    plan, out, steps = argv[0], argv[1], int(argv[2])
    unweighted = len(argv) > 3 and argv[3] == "unweighted"
    doc = json.load(open(plan))
    world = len(rank_slices(doc))
    init = "file://" + os.path.join(tempfile.mkdtemp(), "store")
    mp.spawn(_rank, args=(world, doc, steps, init, out, unweighted), nprocs=world, join=True)
    res = json.load(open(out))
    res["ref"] = reference(doc["model"]["global_batch"], steps)
    res["rank_slices"] = rank_slices(doc)
    with open(out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1:])
