"""A lone column-split linear must divide its output width by tp: FT-Transformer's regression head
(Linear(dim, 1)) was written as 'colwise_gather' at tp=2, one rank held no row, its gradient came
back replicated and Adam's first step failed on the DTensor (aten.lerp_).  The search now leaves it
replicated; a head as wide as tp or wider still splits."""
import torch
from torch import nn

import sapp

TP_CLUSTER = "cpu:gpus=2,peak_flops=1e8,intra_latency=0,intra_bw=1e15,op_overhead=0,sharded_op_overhead=0"


class Net(nn.Module):
    def __init__(self, out):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, out)

    def forward(self, x):
        return self.head(self.norm(x + self.body(x)))


def _plan(out):
    x, y = torch.randn(8, 64, device="meta"), torch.randn(8, out, device="meta")
    return sapp.search(Net(out).to("meta"), TP_CLUSTER, global_batch=8, example_inputs=(x,),
                       loss_fn=nn.functional.mse_loss, targets=y, constraints={"dp": 1, "tp": 2, "pp": 1})


def test_a_one_wide_head_is_not_split_two_ways():
    assert "head" not in _plan(1)["tp_modules"]


def test_a_head_as_wide_as_tp_still_splits():
    assert _plan(2)["tp_modules"].get("head") == "colwise_gather"
