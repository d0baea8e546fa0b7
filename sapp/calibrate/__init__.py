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

from .cluster_fit import calibrate, cluster_from_measurements
from .config import FULL, QUICK, CalibrationError, cfg_elems
from .fit import fit_alpha_beta
from .reference import REFERENCE, REFERENCE_STEPS, TINY, graph_launches, reference_prediction, reference_step_seconds
from .workers import measure, probe, reference_seconds

__all__ = ["calibrate", "cluster_from_measurements", "measure", "probe", "reference_seconds", "reference_step_seconds",
           "reference_prediction", "graph_launches", "fit_alpha_beta", "CalibrationError", "REFERENCE", "TINY",
           "REFERENCE_STEPS", "FULL", "QUICK", "cfg_elems"]
