"""Training data for emitted programs.  Three sources, one order:

  synthetic       the zoo's example batch (same seed on every rank, so ranks agree without talking)
  --data FILE.pt  a torch.save'd (inputs, targets) pair with a leading sample axis
  --data pkg.mod:make_dataset   a zero-argument factory returning a map-style dataset (__len__ +
                  __getitem__ -> (inputs, target)) or an iterable of (inputs, target) samples

Global batch k is samples [k*B, (k+1)*B) of one sample stream; data-parallel rank r of dp reads only
rows [r*B/dp, (r+1)*B/dp) of it.  The stream depends on the data, the global batch B and the seed,
never on the plan, so any plan sees the same global batches in the same order (and a run resumed under
another plan continues where the first stopped).  Map-style data (and files) run epoch after epoch of
floor(n / B) batches, in index order or, with shuffle, in a permutation drawn from (seed, epoch); an
iterable is read from its start and restarted when exhausted.  The data position saved in a
checkpoint is the number of samples consumed, k*B.  A mixed-cluster plan's rank reads its own rows
[lo, hi) of each global batch (`Batches.rows`), the ranks' rows covering the batch once."""
from __future__ import annotations

import importlib

import torch

from ...errors import SappError


class DataError(SappError, ValueError):
    """A --data source cannot feed this plan."""


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def load(path: str):
    """(inputs tuple, targets) from a torch.save'd (inputs, targets) pair with a leading sample axis."""
    from ...fileio import special_kind
    kind = special_kind(path)
    if kind:        # torch.load would block on a FIFO
        raise DataError(f"data file {path} is {kind}, not a file; give a torch.save'd (inputs, targets) file")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DataError(f"data file {path} not found") from None
    except Exception as e:
        raise DataError(f"data file {path} could not be read as a torch.save'd (inputs, targets) pair ({type(e).__name__})") from None
    if not (isinstance(obj, (tuple, list)) and len(obj) == 2):
        raise DataError(f"data file {path} must hold (inputs, targets); found {type(obj).__name__}")
    inputs, targets = _tuple(obj[0]), obj[1]
    for what, x in [("targets", targets)] + [(f"input {i}", x) for i, x in enumerate(inputs)]:
        if not isinstance(x, torch.Tensor) or x.dim() < 1:
            found = f"a {x.dim()}-d tensor" if isinstance(x, torch.Tensor) else f"of type {type(x).__name__}"
            raise DataError(f"data file {path}: {what} is {found}; save (inputs, targets) as tensors (or a tuple of "
                            "input tensors) with a leading sample axis")
    if not inputs:
        raise DataError(f"data file {path} holds no inputs; save (inputs, targets) with at least one input tensor")
    n = targets.shape[0]
    if any(x.shape[0] != n for x in inputs):
        raise DataError(f"data file {path}: inputs and targets have different numbers of samples")
    return inputs, targets


def is_factory(spec: str) -> bool:
    """`pkg.module:callable` rather than a file path."""
    mod, sep, fn = spec.rpartition(":")
    return bool(sep and mod and fn.isidentifier() and all(p.isidentifier() for p in mod.split(".")))


def resolve_factory(spec: str):
    """The callable named by `pkg.module:name` (import errors become one-line DataErrors)."""
    from ...models.resolve import cwd_on_path
    mod, _, fn = spec.rpartition(":")
    cwd_on_path()                  # like --model: the folder the command was typed in
    try:
        module = importlib.import_module(mod)
    except ImportError as e:
        raise DataError(f"--data {spec}: cannot import {mod} ({e}); run from the directory that holds it "
                        "or add it to PYTHONPATH") from None
    f = getattr(module, fn, None)
    if not callable(f):
        raise DataError(f"--data {spec}: {mod} has no callable {fn}")
    return f


def make_dataset(spec: str):
    ds = resolve_factory(spec)()
    if not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")) and not hasattr(ds, "__iter__"):
        raise DataError(f"--data {spec} returned a {type(ds).__name__}: return a map-style dataset "
                        "(__len__ and __getitem__) or an iterable of (inputs, target) samples")
    return ds


def _collate(samples: list):
    """[(inputs, target)] -> (inputs tuple of stacked tensors, stacked targets)."""
    try:
        xs = [_tuple(s[0]) for s in samples]
        inputs = tuple(torch.stack([torch.as_tensor(x[i]) for x in xs]) for i in range(len(xs[0])))
        return inputs, torch.stack([torch.as_tensor(s[1]) for s in samples])
    except (TypeError, IndexError, RuntimeError) as e:
        raise DataError(f"dataset samples must be (inputs, target) pairs of equal-shape tensors ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''})") from None


class Batches:
    """This rank's part of global batch k.  `local(k, dp_rank, dp)` -> (inputs tuple, targets)."""

    def __init__(self, global_batch: int, *, data=None, dataset=None, model=None, shuffle=False, seed=0):
        self.b, self.shuffle, self.seed = global_batch, shuffle, seed
        self.dataset, self._it, self._read = None, None, 0
        if dataset is not None:
            self.dataset = dataset
            self.mapped = hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
            self.n = len(dataset) if self.mapped else None
            return
        self.mapped = True
        if data is not None:
            self.inputs, self.targets = data
        else:
            import sapp.models as models  # not `from .. import`: sapp.__getattr__ recurses on it
            self.inputs = _tuple(models.example_inputs(model, global_batch, "cpu"))
            self.targets = models.example_targets(model, global_batch, "cpu")
        self.n = self.targets.shape[0]
        if self.n < global_batch:
            raise DataError(f"data holds {self.n} samples, fewer than the plan's global batch {global_batch}")

    def position(self, step: int) -> int:
        """Samples consumed before global batch `step` (the data position a checkpoint records)."""
        return step * self.b

    def _indices(self, step: int, lo: int, hi: int) -> torch.Tensor:
        """Dataset indices of rows [lo, hi) of global batch `step` (map-style data)."""
        per_epoch = self.n // self.b
        if per_epoch < 1:
            raise DataError(f"data holds {self.n} samples, fewer than the plan's global batch {self.b}")
        epoch, k = divmod(step, per_epoch)
        pos = torch.arange(k * self.b + lo, k * self.b + hi)
        if not self.shuffle:
            return pos
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g)[pos]

    def local(self, step: int, dp_rank: int = 0, dp: int = 1):
        if self.b % dp:
            raise DataError(f"global batch {self.b} does not divide over dp={dp}; use a multiple of {dp}")
        return self.rows(step, dp_rank * self.b // dp, (dp_rank + 1) * self.b // dp)

    def rows(self, step: int, lo: int, hi: int):
        """Rows [lo, hi) of global batch `step` (a mixed-cluster plan's uneven shares)."""
        if self.dataset is None:
            idx = self._indices(step, lo, hi)
            return tuple(x[idx] for x in self.inputs), self.targets[idx]
        if self.mapped:
            return _collate([self.dataset[int(i)] for i in self._indices(step, lo, hi)])
        return _collate(self._stream(step * self.b + lo, hi - lo))

    def __call__(self, step: int):
        """The whole global batch of `step`."""
        return self.local(step)

    def _stream(self, start: int, count: int) -> list:
        """Samples [start, start+count) of the iterable, restarted at its end; reads forward only,
        so a rank skips the rows other dp ranks train on (and, on resume, everything before)."""
        if self._it is None or self._read > start:
            self._it, self._read = iter(self.dataset), 0
        out, fresh = [], self._read == 0          # fresh: nothing read since the iterator (re)started
        while len(out) < count:
            try:
                s = next(self._it)
            except StopIteration:
                if fresh:
                    raise DataError("the --data iterable yielded no samples") from None
                self._it, fresh = iter(self.dataset), True
                continue
            fresh = False
            if self._read >= start:
                out.append(s)
            self._read += 1
        return out
