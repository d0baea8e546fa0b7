"""An example of your own model for `sapp search --model mymodel:build` (docs/models.md)."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width=256, depth=4, classes=10):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(width=256, depth=4, batch=32):
    """The module, an example batch, its targets and the loss: what one training step sees."""
    x = torch.randn(batch, width)
    y = torch.randint(0, 10, (batch,))
    return Net(width, depth), (x,), y, nn.functional.cross_entropy
