"""The reference and tiny transformer blocks: their eager training step measured (-> compute_scale,
op_overhead) and what the cost model predicts for them."""
from __future__ import annotations

import functools
import statistics
import time

from .machine import _timeit


# The reference block for `compute_scale`: a small GPT (not a zoo size the benches evaluate) trained
# one step at a time, eager, as emitted programs run.
REFERENCE = ("gpt-small", {"l": 2, "h": 256, "a": 4, "s": 128, "V": 1024, "ffn": 1024}, 4)


# A transformer of the same structure with tiny dimensions: the arithmetic of its training step is
# nil, so the step is the framework's cost per operator in a real graph (`op_overhead`, CPU).
TINY = ("gpt-small", {"l": 2, "h": 16, "a": 2, "s": 8, "V": 32, "ffn": 64}, 1)


# steps the reference is timed over; their median is its figure (the module docstring says why)
REFERENCE_STEPS = 7


def _measure_reference(torch, dev, cfg, sync, ref=REFERENCE, lockstep=None):
    """Seconds of one forward + backward of the reference model `ref` (gradients freed each step, as
    the training loop does).  `lockstep`: a callable every rank runs after each step (a one-element
    all-reduce), so that, as in data-parallel training, a step lasts until the slowest rank is done."""
    import sapp.models as models
    name, over, batch = ref
    torch.manual_seed(0)
    m = models.get(name, device=dev.type, **over)
    loss_fn = models.loss_fn(m)
    x = models.example_inputs(m, batch, device=dev)
    y = models.example_targets(m, batch, device=dev)

    def step():
        m.zero_grad(set_to_none=True)
        loss_fn(m(*x), y).backward()

    if lockstep is None:
        return _timeit(step, cfg["min_time"] * REFERENCE_STEPS / 3, sync, rounds=REFERENCE_STEPS,
                       stat=statistics.median)
    # a fixed count (every rank must join every all-reduce), each step timed end to end
    step()
    lockstep()
    times, last = [], time.perf_counter()
    for _ in range(REFERENCE_STEPS):
        step()
        lockstep()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return statistics.median(times)


def _reference_graph(ref):
    name, over, batch = ref
    return _captured(name, tuple(sorted(over.items())), batch)


@functools.lru_cache(maxsize=8)
def _captured(name, over, batch):
    # one capture per reference model and process: cluster_from_measurements prices TINY twice and
    # REFERENCE once (~0.5-1 s a capture); the cost functions only read the graph.  The capture layer
    # itself, at the batch sapp.api captures at (what api.capture_graph adds -- input checks, timing,
    # torch's noise held back on failure -- a zoo model on meta does not need): calibration sits below the api
    import sapp.models as models
    from ..capture import DEFAULT_BATCH, capture
    return capture(models.get(name, device="meta", **dict(over)), batch=DEFAULT_BATCH).rebatch(batch)


def reference_prediction(cluster, ref=REFERENCE) -> float:
    """What the cost model predicts for `_measure_reference(ref)` on `cluster` (forward + backward of
    every operator of the captured reference model, one device)."""
    from ..costmodel.nodes import node_cost
    from ..costmodel.settings import CostSettings
    from sapp.cluster.mesh import Level, Mesh
    mesh, st = Mesh((Level(1, "intra"),)), CostSettings(precision="fp32")
    return sum(node_cost(n, (None,), mesh, cluster, st).compute_s for n in _reference_graph(ref).nodes.values())


def graph_launches(ref, async_launch=False) -> int:
    """Operator launches the cost model counts for one forward + backward of `ref`."""
    from ..costmodel.nodes import launches_of
    return sum(launches_of(n.kind, False, async_launch) + launches_of(n.kind, True, async_launch)
               for n in _reference_graph(ref).nodes.values() if n.kind != "input")


def _lockstep(torch, dist, procs):
    """What ends a data-parallel step on every rank: a one-element all-reduce (None alone)."""
    if procs < 2:
        return None
    flag = torch.ones(1)
    return lambda: dist.all_reduce(flag)


def reference_step_seconds(torch, dist, procs, min_time=0.3) -> float:
    """The reference block's training step on this CPU rank now, timed as calibration times it (in
    lockstep over `procs` initialised processes; `min_time` only matters for a single one)."""
    return _measure_reference(torch, torch.device("cpu"), {"min_time": min_time}, lambda: None,
                              lockstep=_lockstep(torch, dist, procs))
