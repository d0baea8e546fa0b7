"""Time of the optimizer update on the device.

The update is memory-bound: for every parameter whose optimizer state this device holds it reads the
gradient and the states and writes the states and the weight back.  Mixed-precision Adam touches the
fp32 master weight, m and v (read + write, 2 x 12 B), the bf16 gradient (2 B) and writes the bf16
weight copy (2 B): 28 B per parameter; fp32 Adam reads/writes weight, m, v (2 x 12 B) and reads the
gradient (4 B): also 28 B.  Small per step for big dense models, but it dominates embedding-heavy
models (a 2B-row table updated densely every step) and it is what ZeRO-1+ divides by dp.

Dispatch: torch's optimizers run one op sequence per parameter tensor on a CPU (the single-tensor
path; ops on the parameter-sized tensors listed in UPDATE_OPS) and one multi-tensor ("foreach") op
per step on GPUs.  On CPU eager that dispatch is serial with the arithmetic and, for sharded
parameters (DTensor), ~10x a plain op: measured on this 2-core box, 53 tensors x 7 Adam ops at
~85 us = 32 ms of a 36 ms ZeRO-3 update of 0.9 M parameters.  Plain (non-DTensor) parameters get
torch's fused Adam from emit, one call for all tensors: ~2 bare dispatches' worth per tensor on that
CPU (200 tiny tensors: 2.1 ms fused, 13 ms single-tensor).

Bandwidth: the update runs once per step, after a forward and backward that sweep the caches, so
it streams at the DRAM rate (`mem_bandwidth`) even for small tensors.  Looped hot in a benchmark it
runs from cache (gpt-small's 53 tensors: 0.9 ms; a 4.2 M-parameter MLP of 8 tensors at 22 GB/s), but
in a training step on this CPU gpt-small's update took 2.8 ms: its 26 MB at the copy rate."""
from __future__ import annotations

from .torchtitan import update_bytes


def update_bytes_per_param(settings) -> float:
    tt = update_bytes(settings)         # torchtitan's clip + foreach AdamW pass by pass (costmodel.torchtitan)
    if tt is not None:
        return tt
    opt = settings.optimizer_bytes
    if settings.mixed:
        # master weight is part of `opt` (12 B for Adam); bf16 grad read + bf16 weight written
        return 2 * opt + settings.grad_bytes + settings.weight_bytes
    return 2 * (opt + settings.weight_bytes) + settings.grad_bytes


def updated_params(optimizer_state_bytes: float, param_bytes: float, settings) -> float:
    """Parameters this device updates, from the optimizer state it holds (ZeRO-sharded or not)."""
    if settings.optimizer_bytes > 0:
        return optimizer_state_bytes / settings.optimizer_bytes
    return param_bytes / settings.weight_bytes


# ops per parameter tensor of torch's single-tensor update (Adam: exp_avg.lerp_, exp_avg_sq.mul_ +
# addcmul_, sqrt, div_, add_ eps, param.addcdiv_; AdamW adds the decoupled weight decay mul_)
UPDATE_OPS = {"adam": 7, "adamw": 8, "sgd": 3, "sgd-nomomentum": 1, "adagrad": 4, "adam-bf16-master": 7,
              "adam-bf16-states": 7, "adam-bf16": 7}
# the optimizers emit fuses (plain parameters), and their dispatch per tensor on a serial device
FUSED = ("adam", "adamw")
FUSED_OPS_PER_TENSOR = 2


def optimizer_dispatch_time(tensors: float, cluster, settings, sharded: bool = False) -> float:
    """Host dispatch of the update of `tensors` parameter tensors: per tensor on a serial (CPU)
    device, one foreach op per update op on an asynchronous one, at `update_op_overhead` (a bare op's
    dispatch; the graph's per-op figure carries module and autograd costs an update has none of).
    `sharded`: the parameters are DTensors (ZeRO-2/3 via FSDP2, tensor parallelism) and use
    `sharded_op_overhead` when set; otherwise Adam/AdamW run fused (FUSED_OPS_PER_TENSOR)."""
    ops = UPDATE_OPS.get(settings.optimizer, 7)
    if not sharded and settings.optimizer in FUSED and not cluster.async_launch:
        ops = FUSED_OPS_PER_TENSOR
    per_op = getattr(cluster, "update_op_overhead", 0.0) or cluster.op_overhead
    if sharded and getattr(cluster, "sharded_op_overhead", 0.0) > 0:
        per_op = cluster.sharded_op_overhead
    if tensors <= 0 or per_op <= 0:
        return 0.0
    return (ops if cluster.async_launch else ops * tensors) * per_op


def optimizer_step_time(optimizer_state_bytes: float, param_bytes: float, cluster, settings,
                        tensors: float = 0.0, sharded: bool = False) -> float:
    """Seconds per step for the device-side update of the parameters this device owns (`tensors`:
    how many parameter tensors that is, for the dispatch; 0 prices the memory traffic only).
    Dispatch adds to the traffic on a serial device and overlaps it on an asynchronous one."""
    n = updated_params(optimizer_state_bytes, param_bytes, settings)
    if n <= 0:
        return 0.0
    nbytes = n * update_bytes_per_param(settings)
    # from DRAM whatever the tensors' sizes (module docstring, "Bandwidth")
    t = nbytes / (cluster.mem_bandwidth * cluster.memory_efficiency)
    host = optimizer_dispatch_time(tensors, cluster, settings, sharded)
    if cluster.async_launch:
        return max(t, host)
    return t + host
