"""Plain MLP: `layers` (ModuleList of fc + activation blocks, dims[i] -> dims[i+1]) then `head`
(dims[-1] -> classes).  act="none" makes it linear-only (used to check FLOP counts exactly)."""
from torch import nn


class MLPBlock(nn.Module):
    def __init__(self, din, dout, act):
        super().__init__()
        self.fc = nn.Linear(din, dout)
        self.act = nn.ReLU() if act == "relu" else nn.GELU() if act == "gelu" else nn.Identity()

    def forward(self, x):
        return self.act(self.fc(x))


class MLP(nn.Module):
    def __init__(self, dims=(1024, 1024, 1024, 1024), classes=1000, act="relu"):
        super().__init__()
        self.layers = nn.ModuleList(MLPBlock(dims[i], dims[i + 1], act) for i in range(len(dims) - 1))
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x):
        for block in self.layers:
            x = block(x)
        return self.head(x)


def param_count(dims=(1024, 1024, 1024, 1024), classes=1000, **_):
    d = list(dims) + [classes]
    return sum(d[i] * d[i + 1] + d[i + 1] for i in range(len(d) - 1))
