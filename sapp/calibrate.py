"""`sapp calibrate`: measure this machine and write a Cluster description the search accepts.

What is measured, in `procs` worker processes running at the same time (so every figure is what one
"device" gets while its peers are busy too, as in a real run):
  - GEMM FLOP/s at a few sizes: the best sustained rate is `peak_flops`; the median rate over the
    sizes relative to it is `compute_efficiency` (what typical, smaller GEMMs reach);
  - memory bandwidth from a large tensor copy (read + write): `mem_bandwidth`; an element-wise add
    relative to it is `memory_efficiency`;
  - dropout on a large tensor: `rng_rate` (random draws per second; a CPU core is RNG-bound here);
  - the same two at sizes from 64 KB to 64 MB (`mem_bw_curve`, `rng_curve`): an element-wise add
    with a fresh output, as training allocates one, and dropout.  Small tensors stay in cache and
    stream several times faster than DRAM (this 2-core box: ~60 GB/s under 4 MB, ~18 GB/s above
    16 MB), and training is mostly small tensors on a CPU;
  - host<->device copy bandwidth (pinned memory) when CUDA exists, else the memory bandwidth;
  - per-operator dispatch overhead: a chain of tiny element-wise ops (so the arithmetic is nil)
    recorded by autograd as in training, timed forward and backward: `op_overhead` is the forward
    time per op; on CPU the dispatching thread also computes, so `async_launch` is false (on GPUs
    the host enqueues kernels ahead of the device: true); and an in-place op on a parameter sharded
    over the ranks (DTensor, as FSDP2 / tensor parallelism hold them): `sharded_op_overhead`;
  - the eager training step of a transformer with tiny dimensions (CPU only): with nil arithmetic it
    is all framework cost, and over the launches the cost model counts for it gives the graph's
    per-op `op_overhead` (module calls, autograd nodes, the backward's views and gradient
    accumulation come with each counted op: ~4x a bare dispatch); the bare figure stays for the
    optimizer update as `update_op_overhead`;
  - a reference GPT block's eager training step (forward + backward): its time over what the
    figures above predict for it is `compute_scale` (CPU only).  This step and the tiny one are the
    median of 7, not the best: a plan's measured step is a median, and on a shared or
    oversubscribed CPU the single fastest steps are moments when a peer happened to idle.  With
    several processes the reference steps run in lockstep (a one-element all-reduce closes each, on
    every rank), as a data-parallel step lasts until its slowest rank is done;
  - all_reduce times at several sizes over gloo (CPU) or NCCL (GPUs), fitted to the ring model
    t = 2(n-1)·α + 2(n-1)/n · B/β by least squares: `intra_latency` = α, `intra_bw` = β; all-gather,
    reduce-scatter and point-to-point (ping-pong between rank pairs, as pipeline stages send) get
    their own α/β in `collective_fits`.
On a CPU the GEMM rates, the reference step and the tiny step are measured twice, at the start and
at the end, and the better pass of each is kept: a shared machine's speed drifts within seconds, and
compute_scale is a ratio of figures taken at different moments.
The rest (nodes=1, gpus_per_node=procs, memory sizes) comes from the machine; the "cpu" preset is the
base for anything not measured.  Every worker runs under a hard timeout."""
from __future__ import annotations

import functools
import os
import queue as _queue
import socket
import statistics
import time

from .cluster import PRESETS, Cluster
from .errors import SappError


class CalibrationError(SappError):
    """Calibration could not run or finish in time."""


FULL = {"gemm": (256, 512, 1024, 1536), "gemm_cuda": (1024, 2048, 4096, 8192), "copy_mb": 128, "ar_bytes": (4096, 65536, 1 << 20, 4 << 20, 16 << 20),
        "curve_kb": (64, 256, 1024, 4096, 16384, 65536), "op_elems": 1 << 19, "min_time": 0.4}
QUICK = {"gemm": (256, 512, 768), "gemm_cuda": (1024, 4096), "copy_mb": 32, "ar_bytes": (4096, 65536, 1 << 20, 4 << 20),
         "curve_kb": (256, 4096, 32768), "op_elems": 1 << 18, "min_time": 0.12}


# ---- pure helpers -------------------------------------------------------------------------------
def fit_alpha_beta(sizes, times, n, factor=2.0):
    """Least-squares fit of the ring all-reduce model t = 2(n-1)·α + 2(n-1)/n·B/β (`factor` 1: the
    all-gather / reduce-scatter model t = (n-1)·α + (n-1)/n·B/β, B the full buffer).
    Returns (alpha_s, beta_bytes_per_s, rms relative residual).  Weights each point by 1/t so small
    and large messages count alike; α and 1/β are kept >= 0."""
    import numpy as np
    if n < 2:
        raise CalibrationError("a collective fit needs at least 2 processes; use --procs 2 or more")
    if len(sizes) < 2 or len(sizes) != len(times):
        raise CalibrationError("a collective fit needs times for at least 2 message sizes")
    B = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    A = np.stack([np.full_like(B, factor * (n - 1)), factor * (n - 1) / n * B], axis=1)
    w = 1.0 / t
    try:
        from scipy.optimize import nnls
        coef, _ = nnls(A * w[:, None], t * w)
    except ImportError:               # numpy only: unconstrained, then clamp
        coef = np.linalg.lstsq(A * w[:, None], t * w, rcond=None)[0]
        coef = np.maximum(coef, 0.0)
    alpha, inv_beta = float(coef[0]), float(coef[1])
    if inv_beta <= 0:
        # Every size took the same time: bandwidth is not the limit at these sizes.
        inv_beta = float(np.max(t / (factor * (n - 1) / n * B))) * 1e-3
    pred = A @ np.array([alpha, inv_beta])
    resid = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    return alpha, 1.0 / inv_beta, resid


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _usable_cpus() -> int:
    """CPUs this process may run on (taskset / cgroup affinity), not all the machine has."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _total_ram():
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return PRESETS["cpu"].host_memory


# ---- measurements (run inside each worker) ------------------------------------------------------
def _timeit(fn, min_time, sync, rounds=3, stat=min):
    """Seconds per call: `rounds` rounds of repeats, each until `min_time / rounds` has passed;
    `stat` (min: the undisturbed rate; statistics.median: the typical one) over the rounds' means."""
    fn()
    sync()
    per = []
    for _ in range(rounds):
        reps, t0 = 0, time.perf_counter()
        while True:
            fn()
            reps += 1
            sync()
            el = time.perf_counter() - t0
            if el >= min_time / rounds:
                break
        per.append(el / reps)
    return stat(per)


def _measure_gemm(torch, dev, cfg, sync):
    """FLOP/s of square GEMMs at the configured sizes (bf16 on GPUs, fp32 on CPUs)."""
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    gemm = {}
    # a GPU's matrix units fill only at thousands per side (H100 bf16: ~190 TFLOP/s at 1536, ~750 at 8192)
    for n in (cfg["gemm_cuda"] if dev.type == "cuda" else cfg["gemm"]):
        # cache-hot repeats, as in training a small model's operands stay in cache (gpt-small on this
        # CPU: 77 GFLOP/s in a profiled step, 77 here; rotating 96 MB of operands gave 67)
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        t = _timeit(lambda: torch.mm(a, b), cfg["min_time"], sync)
        gemm[n] = 2.0 * n ** 3 / t
    return gemm


def _measure_local(torch, dev, cfg, sync):
    gemm = _measure_gemm(torch, dev, cfg, sync)
    numel = cfg["copy_mb"] * (1 << 20) // 4
    src = torch.empty(numel, device=dev, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    t_copy = _timeit(lambda: dst.copy_(src), cfg["min_time"], sync)
    other = torch.empty_like(src).uniform_()
    t_add = _timeit(lambda: torch.add(src, other, out=dst), cfg["min_time"], sync)
    # dropout: one random draw per element (what dropout masks cost beyond the memory traffic)
    t_rng = _timeit(lambda: torch.nn.functional.dropout(src, 0.1, True), cfg["min_time"], sync)
    copy_bw = 2.0 * numel * 4 / t_copy            # read + write
    add_bw = 3.0 * numel * 4 / t_add              # two reads + one write
    curve_bw, curve_rng = [], []
    # CPU only: a GPU's small ops are launch-bound (priced by op_overhead), and timing each call with a
    # synchronise would measure that latency, not the cache
    for kb in (cfg["curve_kb"] if dev.type != "cuda" else ()):
        # as in training: inputs just written (warm where they fit in cache), a fresh output each call
        n = kb * 1024 // 4
        a = torch.empty(n, device=dev, dtype=torch.float32).uniform_()
        b = torch.empty_like(a).uniform_()
        t = _timeit(lambda: torch.add(a, b), cfg["min_time"] / 2, sync)
        curve_bw.append((3.0 * n * 4, 3.0 * n * 4 / t))
        t = _timeit(lambda: torch.nn.functional.dropout(a, 0.1, True), cfg["min_time"] / 2, sync)
        curve_rng.append((float(n), n / t))
    h2d = None
    if dev.type == "cuda":
        host = torch.empty(numel, dtype=torch.float32).pin_memory()
        t_h2d = _timeit(lambda: dst.copy_(host, non_blocking=True), cfg["min_time"], sync)
        h2d = numel * 4 / t_h2d
    return {"gemm_flops": gemm, "copy_bw": copy_bw, "add_bw": add_bw, "h2d_bw": h2d, "rng_rate": numel / t_rng,
            "mem_bw_curve": curve_bw or None, "rng_curve": curve_rng or None}


def _op_cases(torch, dev, n):
    """name -> (make inputs, run) for the non-GEMM ops transformers and MLPs spend time in; ~n elements
    each, in shapes like theirs (softmax over 64 keys, layer norm over 128 features, a causal mask
    broadcast over batch and heads, a 512-way loss)."""
    F = torch.nn.functional
    x = lambda *shape: torch.randn(*shape, device=dev, requires_grad=True)
    heads = max(1, n // 4096)
    return {
        "gelu": (lambda: (x(n),), lambda a: F.gelu(a)),
        "relu": (lambda: (x(n),), lambda a: F.relu(a)),
        "silu": (lambda: (x(n),), lambda a: F.silu(a)),
        "add": (lambda: (x(n), x(n)), lambda a, b: a + b),
        "mul": (lambda: (x(n), x(n)), lambda a, b: a * b),
        "softmax": (lambda: (x(n // 64, 64),), lambda a: torch.softmax(a, -1)),
        "log_softmax": (lambda: (x(n // 512, 512),), lambda a: torch.log_softmax(a, -1)),
        "layer_norm": (lambda: (x(n // 128, 128), x(128), x(128)), lambda a, w, b: F.layer_norm(a, (128,), w, b)),
        "masked_fill": (lambda: (x(heads, 64, 64),),
                        lambda a: a.masked_fill(torch.ones(64, 64, dtype=torch.bool, device=dev).triu(1), 0.0)),
        "cross_entropy_loss": (lambda: (x(n // 512, 512),),
                               lambda a: F.cross_entropy(a, torch.zeros(a.shape[0], dtype=torch.long, device=dev))),
    }


def _measure_op_rates(torch, dev, cfg, sync):
    """Forward and backward elements/s of each op in `_op_cases` (autograd recording as in training;
    backward time = forward+backward - forward)."""
    n = cfg["op_elems"]
    out = {}
    for name, (make, fn) in _op_cases(torch, dev, n).items():
        args = make()
        elems = float(max(a.numel() for a in args))
        t_f = _timeit(lambda: fn(*args), cfg["min_time"] / 4, sync)

        grad_out = torch.ones_like(fn(*args))

        def fwd_bwd():
            # gradients handed back, not accumulated into the inputs: as between layers in training
            torch.autograd.grad(fn(*args), args, grad_out)

        t_fb = _timeit(fwd_bwd, cfg["min_time"] / 4, sync)
        out[name] = (elems / t_f, elems / max(t_fb - t_f, 0.05 * t_fb))
    return out


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
    # REFERENCE once (~0.5-1 s a capture); the cost functions only read the graph
    import sapp.models as models
    from .api import capture_graph
    return capture_graph(models.get(name, device="meta", **dict(over)))[0].rebatch(batch)


def reference_prediction(cluster, ref=REFERENCE) -> float:
    """What the cost model predicts for `_measure_reference(ref)` on `cluster` (forward + backward of
    every operator of the captured reference model, one device)."""
    from .costmodel.nodes import node_cost
    from .costmodel.settings import CostSettings
    from .mesh import Level, Mesh
    mesh, st = Mesh((Level(1, "intra"),)), CostSettings(precision="fp32")
    return sum(node_cost(n, (None,), mesh, cluster, st).compute_s for n in _reference_graph(ref).nodes.values())


def graph_launches(ref, async_launch=False) -> int:
    """Operator launches the cost model counts for one forward + backward of `ref`."""
    from .costmodel.nodes import launches_of
    return sum(launches_of(n.kind, False, async_launch) + launches_of(n.kind, True, async_launch)
               for n in _reference_graph(ref).nodes.values() if n.kind != "input")


LAUNCH_CHAIN = 200      # tiny ops per timed chain: long enough that the loop and sum() are noise


def _measure_launch(torch, dev, cfg, sync):
    """Seconds of host dispatch per operator, forward and backward: a chain of LAUNCH_CHAIN tiny
    multiplications on a 16-element tensor that requires grad (the arithmetic is ~nothing, so the
    time is the framework's dispatch + autograd recording + launch).  Backward is reported for the
    notes: the cost model charges it per gradient kernel at the forward rate."""
    w = torch.ones(16, device=dev, requires_grad=True)

    def fwd():
        h = w
        for _ in range(LAUNCH_CHAIN):
            h = h * 1.0
        return h

    def fwd_bwd():
        fwd().sum().backward()

    t_f = _timeit(fwd, cfg["min_time"] / 2, sync) / LAUNCH_CHAIN
    t_fb = _timeit(fwd_bwd, cfg["min_time"] / 2, sync) / LAUNCH_CHAIN
    return {"fwd": t_f, "bwd": max(0.0, t_fb - t_f)}


def _measure_sharded_launch(torch, dev, cfg, sync, procs):
    """Seconds per in-place op on a parameter sharded over all ranks (a DTensor, as FSDP2 and
    tensor parallelism hold them): what an optimizer update pays per op.  Pointwise on Shard(0) with
    a scalar: no communication, only the tensor-subclass dispatch."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh(dev.type, (procs,))
    p = distribute_tensor(torch.ones(16 * procs, device=dev), mesh, [Shard(0)])
    chain = LAUNCH_CHAIN // 4

    def step():
        with torch.no_grad():
            for _ in range(chain):
                p.mul_(1.0)

    return _timeit(step, cfg["min_time"] / 2, sync) / chain


def _collective_op(torch, dist, dev, kind, nbytes):
    """A call of `kind` on a `nbytes` full buffer (fp32): all_reduce in place, all_gather into a full
    output from a 1/n shard, reduce_scatter from a full input into a 1/n shard."""
    n = dist.get_world_size()
    numel = max(n, nbytes // 4 // n * n)
    if kind == "all_reduce":
        x = torch.ones(numel, device=dev)
        return lambda: dist.all_reduce(x)
    full, shard = torch.ones(numel, device=dev), torch.ones(numel // n, device=dev)
    # torch 2.13 renamed the tensor forms (*_single) and warns on the old names; older torch has only those
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if kind == "all_gather":
        return lambda: gather(full, shard)
    return lambda: scatter(shard, full)


FSDP_UNITS, FSDP_WIDTH = 4, 256


def _measure_fsdp(torch, dev, cfg, sync, procs):
    """Seconds per step of stacks of FSDP_UNITS units (each its own fully_shard unit, + root) with
    FSDP2 and replicated: units of one Linear (2 parameter tensors) and of Linear-LayerNorm-Linear
    (6 tensors, same bytes).  The differences, less the collectives, give FSDP2's runtime cost per
    unit and per parameter tensor (its copy-in/out and bookkeeping run tensor by tensor)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)

    def stack():
        return torch.nn.Sequential(*(torch.nn.Linear(FSDP_WIDTH, FSDP_WIDTH) for _ in range(FSDP_UNITS))).to(dev)

    def stack6():        # the same units holding 6 parameter tensors each instead of 2
        return torch.nn.Sequential(*(torch.nn.Sequential(
            torch.nn.Linear(FSDP_WIDTH, FSDP_WIDTH // 2), torch.nn.LayerNorm(FSDP_WIDTH // 2),
            torch.nn.Linear(FSDP_WIDTH // 2, FSDP_WIDTH)) for _ in range(FSDP_UNITS))).to(dev)

    x = torch.randn(8, FSDP_WIDTH, device=dev)
    mesh = init_device_mesh(dev.type, (procs,))

    def shard(m):
        for unit in m:
            fully_shard(unit, mesh=mesh)
        return fully_shard(m, mesh=mesh)

    out = {}
    for name, m in (("plain", stack()), ("fsdp", shard(stack())), ("plain6", stack6()), ("fsdp6", shard(stack6()))):
        def step():
            m.zero_grad(set_to_none=True)
            m(x).sum().backward()
        # every rank runs the same number of steps (collectives inside): a fixed count, best of 3
        step()
        sync()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(10):
                step()
            sync()
            best = min(best, (time.perf_counter() - t0) / 10)
        out[name] = best
    return out


def _measure_allreduce(torch, dist, dev, cfg, sync, kind="all_reduce"):
    """Every rank must issue the same number of collectives, so the repetition count is agreed on
    (MAX over ranks) instead of each rank timing until its own clock says stop."""
    out = {}
    for nbytes in cfg["ar_bytes"]:
        op = _collective_op(torch, dist, dev, kind, nbytes)

        def run(reps):
            for _ in range(reps):
                op()
        out[nbytes] = _time_agreed(torch, dist, dev, cfg, sync, run, cap=2000)
    return out


def _time_agreed(torch, dist, dev, cfg, sync, run, cap):
    """Best seconds per call of `run(reps)` (reps calls) over 3 timed rounds, with a repetition count
    every rank agrees on (MAX), since collectives must be issued the same number of times."""
    run(1)
    sync()
    t0 = time.perf_counter()
    run(3)
    sync()
    est = (time.perf_counter() - t0) / 3
    reps = torch.tensor([max(1, min(cap, int(cfg["min_time"] / 3 / max(est, 1e-7))))], device=dev)
    dist.all_reduce(reps, op=dist.ReduceOp.MAX)
    reps = int(reps.item())
    best = float("inf")
    for _ in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        run(reps)
        sync()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def _measure_p2p(torch, dist, dev, cfg, sync):
    """One-way seconds of a point-to-point message per size: ranks 2k and 2k+1 ping-pong (blocking
    send / recv, as a pipeline stage boundary does), half the round trip; every pair at once, so the
    processes contend as a pipeline's do.  An odd last rank only takes part in agreeing the counts."""
    rank, n = dist.get_rank(), dist.get_world_size()
    peer = rank ^ 1 if (rank ^ 1) < n else None
    out = {}
    for nbytes in cfg["ar_bytes"]:
        x = torch.ones(max(1, nbytes // 4), device=dev)

        def ping(reps):
            for _ in range(reps):
                if peer is None:
                    return
                if rank % 2 == 0:
                    dist.send(x, peer)
                    dist.recv(x, peer)
                else:
                    dist.recv(x, peer)
                    dist.send(x, peer)
        # a round trip per call: one way is half of it
        out[nbytes] = _time_agreed(torch, dist, dev, cfg, sync, ping, cap=1000) / 2
    return out


def _worker(rank, procs, port, cfg, threads, results):
    try:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(threads)
        cuda = torch.cuda.is_available() and torch.cuda.device_count() >= procs
        dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(dev)
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        if procs > 1:
            dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                    rank=rank, world_size=procs)
            dist.barrier()
        local = _measure_local(torch, dev, cfg, sync)
        local["launch"] = _measure_launch(torch, dev, cfg, sync)
        if dev.type != "cuda":       # GPUs: these ops are memory- or launch-bound, as the roofline says
            local["op_rates"] = _measure_op_rates(torch, dev, cfg, sync)
            lock = _lockstep(torch, dist, procs)
            local["reference_s"] = _measure_reference(torch, dev, cfg, sync, lockstep=lock)
            local["tiny_s"] = _measure_reference(torch, dev, cfg, sync, TINY)
        if procs > 1:
            local["launch"]["sharded"] = _measure_sharded_launch(torch, dev, cfg, sync, procs)
        ar = _measure_allreduce(torch, dist, dev, cfg, sync) if procs > 1 else {}
        others = {}
        if procs > 1 and not cuda:
            local["fsdp"] = _measure_fsdp(torch, dev, cfg, sync, procs)
        if procs > 1:
            for kind in ("all_gather", "reduce_scatter"):
                try:
                    others[kind] = _measure_allreduce(torch, dist, dev, cfg, sync, kind)
                except RuntimeError:          # a backend without it: the all-reduce fit stands in
                    pass
            others["p2p"] = _measure_p2p(torch, dist, dev, cfg, sync)
        if dev.type != "cuda":
            # a shared machine's speed drifts by tens of percent within seconds, and compute_scale is a
            # ratio of figures taken at different moments: measure the compute figures again at the
            # end and keep each one's better pass (what the machine does undisturbed)
            again = _measure_gemm(torch, dev, cfg, sync)
            local["gemm_flops"] = {n: max(r, again[n]) for n, r in local["gemm_flops"].items()}
            local["reference_s"] = min(local["reference_s"], _measure_reference(torch, dev, cfg, sync, lockstep=lock))
            local["tiny_s"] = min(local["tiny_s"], _measure_reference(torch, dev, cfg, sync, TINY))
        info = {"cuda": cuda, "backend": ("nccl" if cuda else "gloo") if procs > 1 else None,
                "device_memory": float(torch.cuda.get_device_properties(dev).total_memory) if cuda else None,
                "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu"}
        results.put((rank, {"local": local, "allreduce": ar, "collectives": others, **info}))
        if procs > 1:
            dist.destroy_process_group()
    except Exception as e:            # reported to the parent, which raises a one-line error
        results.put((rank, {"error": f"{type(e).__name__}: {e}"}))


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


def _probe_worker(rank, procs, port, cfg, threads, results):
    try:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(threads)
        if procs > 1:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=procs)
        ref = reference_step_seconds(torch, dist, procs, cfg["min_time"])
        if procs > 1:
            dist.destroy_process_group()
        results.put((rank, {"reference_s": ref}))
    except Exception as e:
        results.put((rank, {"error": f"{type(e).__name__}: {e}"}))


def probe(procs=2, timeout_s=60.0, threads=None) -> float:
    """Seconds of the reference block's training step on the slowest of `procs` concurrent CPU
    processes, now (a few seconds): what `compute_scale` was measured from.  Its ratio to the
    calibration's own figure is how much faster or slower a shared machine runs than when it was
    calibrated (bench.calibration_accuracy reports predictions corrected by it beside the raw ones)."""
    raw = _spawn(_probe_worker, procs, dict(QUICK, min_time=0.3), threads, timeout_s)
    return max(r["reference_s"] for r in raw["ranks"])


def reference_seconds(raw) -> float | None:
    """The calibration's reference-block step (slowest rank), from `measure()` output."""
    refs = [r["local"].get("reference_s") for r in raw["ranks"]]
    return max(refs) if all(refs) else None


def measure(procs=2, quick=False, timeout_s=120.0, threads=None):
    """Run the measurements in `procs` concurrent processes.  Returns the raw figures (per rank)."""
    return _spawn(_worker, procs, QUICK if quick else FULL, threads, timeout_s, quick=quick)


def _spawn(target, procs, cfg, threads, timeout_s, quick=False):
    import multiprocessing as mp
    if procs < 1:
        raise CalibrationError(f"--procs must be >= 1, got {procs}")
    if threads is None:
        threads = max(1, _usable_cpus() // procs)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    workers = [ctx.Process(target=target, args=(r, procs, port, cfg, threads, results), daemon=True)
               for r in range(procs)]
    for w in workers:
        w.start()
    got, deadline, finished = {}, time.monotonic() + timeout_s, False
    try:
        while len(got) < procs:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CalibrationError(f"calibration did not finish within {timeout_s:.0f} s; use --quick, fewer "
                                       f"--procs or a larger --timeout")
            try:
                rank, res = results.get(timeout=min(left, 1.0))
            except _queue.Empty:
                dead = [w for w in workers if w.exitcode not in (None, 0)]
                if dead:
                    raise CalibrationError(f"a calibration worker died (exit code {dead[0].exitcode})") from None
                continue
            if "error" in res:
                raise CalibrationError(f"calibration worker {rank} failed: {res['error']}")
            got[rank] = res
        finished = True
    finally:
        for w in workers:
            if finished:
                w.join(timeout=5)      # let a finished worker tear its process group down
            if w.is_alive():
                w.terminate()
                w.join(timeout=5)
    return {"procs": procs, "threads_per_proc": threads, "quick": bool(quick), "ranks": [got[r] for r in range(procs)]}


def cfg_elems(raw) -> float:
    """Elements per op-rate measurement (to take one dispatch out of a per-element time)."""
    return float((QUICK if raw.get("quick") else FULL)["op_elems"])


def cluster_from_measurements(raw, name="calibrated", base="cpu") -> Cluster:
    """Turn `measure()` output into a Cluster (per-device figures are the slowest rank's)."""
    ranks, procs = raw["ranks"], raw["procs"]
    base_c = PRESETS[base]
    peaks, medians, copies, adds = [], [], [], []
    for r in ranks:
        rates = list(r["local"]["gemm_flops"].values())
        peaks.append(max(rates))
        medians.append(statistics.median(rates))
        copies.append(r["local"]["copy_bw"])
        adds.append(r["local"]["add_bw"])
    peak = min(peaks)
    mem_bw = min(copies)
    compute_eff = max(0.05, min(1.0, min(medians) / peak))
    mem_eff = max(0.05, min(1.0, min(adds) / mem_bw))
    cuda = ranks[0]["cuda"]
    h2d = min(r["local"]["h2d_bw"] for r in ranks) if cuda else mem_bw
    changes = {"name": name, "nodes": 1, "gpus_per_node": procs, "peak_flops": peak, "mem_bandwidth": mem_bw,
               "compute_efficiency": round(compute_eff, 3), "memory_efficiency": round(mem_eff, 3), "h2d_bw": h2d}
    ram = _total_ram()
    changes["host_memory"] = ram
    changes["device_memory"] = ranks[0]["device_memory"] if cuda else ram / procs
    changes["host_mem_bandwidth"] = sum(copies) if not cuda else base_c.host_mem_bandwidth
    changes["host_flops"] = sum(peaks) if not cuda else base_c.host_flops
    rng = [r["local"]["rng_rate"] for r in ranks if r["local"].get("rng_rate")]
    if rng:
        changes["rng_rate"] = min(rng)            # slowest rank
    if not cuda:
        changes["precision"] = "fp32"
    launch = [r["local"]["launch"] for r in ranks if r["local"].get("launch")]
    if launch:
        # the slowest rank's dispatch, like every other per-device figure (the step waits for it)
        changes["op_overhead"] = max(x["fwd"] for x in launch)
        changes["async_launch"] = bool(cuda)
        sharded = [x["sharded"] for x in launch if x.get("sharded")]
        if sharded:
            changes["sharded_op_overhead"] = max(sharded)
    # a bare op's dispatch: what single-op measurements below carry and an optimizer update pays
    overhead = changes.get("op_overhead", 0.0) if not cuda else 0.0
    tiny = [r["local"].get("tiny_s") for r in ranks]
    graph_op = None
    if launch and all(tiny):
        # per launch the cost model counts, a real graph's step costs several bare dispatches (module
        # calls, autograd nodes, the backward's transposes and gradient accumulation); the tiny
        # model's roofline (nearly nothing) comes off first.  Slowest rank, as everywhere
        bare = Cluster.from_dict({**base_c.to_dict(), **changes, "op_overhead": 0.0, "compute_scale": 1.0})
        roof = reference_prediction(bare, TINY)
        graph_op = max(overhead, (max(tiny) - roof) / max(1, graph_launches(TINY)))
        changes["update_op_overhead"] = changes["op_overhead"]
        changes["op_overhead"] = graph_op
    for key in ("mem_bw_curve", "rng_curve"):
        curves = [r["local"].get(key) for r in ranks]
        if all(curves):
            # per size, the slowest rank (every rank measures the same sizes).  On a serial device the
            # cost model adds each op's dispatch to its roofline, so take it out of the measured time
            # (but never more than three quarters of it: a tiny op is still not free)
            pts = []
            for i, c0 in enumerate(curves[0]):
                size, rate = c0[0], min(c[i][1] for c in curves)
                t = size / rate
                pts.append((size, size / max(t - overhead, 0.25 * t)))
            changes[key] = tuple(pts)
    tables = [r["local"].get("op_rates") for r in ranks]
    if all(tables):
        # slowest rank per op and direction, less the serial dispatch like the curves above
        rates = {}
        for name in sorted(tables[0]):
            pair = []
            for k in (0, 1):
                rate = min(t[name][k] for t in tables)
                t = 1.0 / rate
                pair.append(1.0 / max(t - overhead / cfg_elems(raw), 0.25 * t))
            rates[name] = pair
        changes["op_rates"] = rates
    fit = None
    if procs > 1:
        ar = ranks[0]["allreduce"]
        sizes = sorted(ar)
        alpha, beta, resid = fit_alpha_beta(sizes, [ar[s] for s in sizes], procs)
        fit = (alpha, beta, resid)
        changes.update(intra_latency=alpha, intra_bw=beta, inter_latency=alpha, inter_bw=beta)
        fits = {}
        for kind, times in sorted((ranks[0].get("collectives") or {}).items()):
            ks = sorted(times)
            if len(ks) >= 2:
                if kind == "p2p":       # t = α + B/β is the 2-rank all-gather model at twice the bytes
                    a, b, _ = fit_alpha_beta([2 * k for k in ks], [times[k] for k in ks], 2, factor=1.0)
                else:
                    a, b, _ = fit_alpha_beta(ks, [times[k] for k in ks], procs, factor=1.0)
                fits[kind] = [a, b]
        if fits:
            changes["collective_fits"] = fits
        fs = [r["local"].get("fsdp") for r in ranks]
        if all(fs):
            from .costmodel.primitives import collective_time
            fitted = Cluster.from_dict({**base_c.to_dict(), **changes})
            w = FSDP_WIDTH

            def per_unit(key, nbytes):
                comm = (2 * collective_time("all_gather", nbytes, procs, "intra", fitted)
                        + collective_time("reduce_scatter", nbytes, procs, "intra", fitted))
                extra = max(f[key] - f["plain" + key[4:]] for f in fs) / (FSDP_UNITS + 1)   # + the root unit
                return max(0.0, extra - comm)

            u2 = per_unit("fsdp", 4.0 * (w * w + w))
            u6 = per_unit("fsdp6", 4.0 * (w * w + w + w // 2 * 3 + w))
            per_tensor = max(0.0, (u6 - u2) / 4.0)
            changes["fsdp_tensor_overhead"] = per_tensor
            changes["fsdp_unit_overhead"] = max(0.0, u2 - 2.0 * per_tensor)
    notes = (f"calibrated with {procs} {'GPU' if cuda else 'CPU'} process(es), {raw['threads_per_proc']} thread(s) each"
             f"{', ' + ranks[0]['backend'] if ranks[0].get('backend') else ''}"
             f"; GEMM best {peak / 1e9:.1f} GFLOP/s, copy {mem_bw / 1e9:.2f} GB/s")
    if rng:
        notes += f", dropout {changes['rng_rate'] / 1e6:.0f} M random draws/s"
    if launch:
        notes += (f", op dispatch {max(x['fwd'] for x in launch) * 1e6:.1f} us fwd / "
                  f"{max(x['bwd'] for x in launch) * 1e6:.1f} us bwd per bare op"
                  + (f", {graph_op * 1e6:.1f} us per op of a training graph" if graph_op else "")
                  + (f", {changes['sharded_op_overhead'] * 1e6:.0f} us per sharded-parameter op"
                     if "sharded_op_overhead" in changes else ""))
    if "fsdp_unit_overhead" in changes:
        notes += (f", FSDP2 {changes['fsdp_unit_overhead'] * 1e3:.2f} ms per unit + "
                  f"{changes.get('fsdp_tensor_overhead', 0.0) * 1e3:.2f} ms per parameter tensor per step besides collectives")
    for kind, (a, b) in sorted((changes.get("collective_fits") or {}).items()):
        notes += f", {kind} alpha {a * 1e6:.0f} us beta {b / 1e9:.2f} GB/s"
    if fit:
        notes += f", all_reduce alpha {fit[0] * 1e6:.1f} us beta {fit[1] / 1e9:.3f} GB/s (fit rms error {fit[2] * 100:.0f}%)"
    ref_s = reference_seconds(raw)
    if ref_s:
        # the slowest rank's reference step over the cost model's prediction with everything else measured
        measured_c = Cluster.from_dict({**base_c.to_dict(), **changes})
        predicted = reference_prediction(measured_c)
        if len(raw["ranks"]) > 1:        # the lockstep all-reduce closing each timed step, as a run's loss sync
            from .costmodel.primitives import scalar_allreduce_time
            predicted += scalar_allreduce_time(len(raw["ranks"]), "intra", measured_c)
        scale = max(0.5, min(3.0, ref_s / predicted)) if predicted > 0 else 1.0
        changes["compute_scale"] = round(scale, 3)
        notes += f", framework overhead x{scale:.2f} (reference block {ref_s * 1e3:.1f} ms measured)"
    if "mem_bw_curve" in changes:
        pts = changes["mem_bw_curve"]
        notes += (f", element-wise {pts[0][1] / 1e9:.0f} GB/s at {pts[0][0] / 3 / 1024:.0f} KB"
                  f" to {pts[-1][1] / 1e9:.0f} GB/s at {pts[-1][0] / 3 / 2 ** 20:.0f} MB per tensor")
    notes += "; single node: inter-node figures copy the intra-node ones"
    changes["notes"] = notes
    return Cluster.from_dict({**base_c.to_dict(), **changes})


def calibrate(procs=2, quick=False, timeout_s=120.0, name="calibrated", threads=None):
    """Measure and return (Cluster, raw measurements)."""
    raw = measure(procs=procs, quick=quick, timeout_s=timeout_s, threads=threads)
    return cluster_from_measurements(raw, name=name), raw
