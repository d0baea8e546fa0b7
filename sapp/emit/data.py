"""Training data for emitted programs: the global batch of each step (synthetic from the model zoo with
a fixed seed, or rows of a user file); each rank then keeps its data-parallel shard (Program.shard)."""
from __future__ import annotations

import torch

from ..errors import SappError


class DataError(SappError, ValueError):
    """A --data file cannot feed this plan."""


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def load(path: str):
    """(inputs tuple, targets) from a torch.save'd (inputs, targets) pair with a leading sample axis."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DataError(f"data file {path} not found") from None
    except Exception as e:
        raise DataError(f"data file {path} could not be read as a torch.save'd (inputs, targets) pair ({type(e).__name__})") from None
    if not (isinstance(obj, (tuple, list)) and len(obj) == 2):
        raise DataError(f"data file {path} must hold (inputs, targets); found {type(obj).__name__}")
    inputs, targets = _tuple(obj[0]), obj[1]
    n = targets.shape[0]
    if any(x.shape[0] != n for x in inputs):
        raise DataError(f"data file {path}: inputs and targets have different numbers of samples")
    return inputs, targets


class Batches:
    """Global batch for step i.  File data cycles through the rows in order; synthetic data is the
    zoo's example batch (same seed on every rank, so ranks agree without communicating)."""

    def __init__(self, global_batch: int, *, data=None, model=None):
        self.b = global_batch
        if data is not None:
            self.inputs, self.targets = data
            if self.targets.shape[0] < global_batch:
                raise DataError(f"data holds {self.targets.shape[0]} samples, fewer than the plan's global batch "
                                f"{global_batch}")
        else:
            import sapp.models as models  # not `from .. import`: sapp.__getattr__ recurses on it
            self.inputs = _tuple(models.example_inputs(model, global_batch, "cpu"))
            self.targets = models.example_targets(model, global_batch, "cpu")

    def __call__(self, step: int):
        n = self.targets.shape[0]
        if n == self.b:
            return self.inputs, self.targets
        start = (step * self.b) % (n - n % self.b or n)
        idx = torch.arange(start, start + self.b) % n
        return tuple(x[idx] for x in self.inputs), self.targets[idx]
