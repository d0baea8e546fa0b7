"""Time of the optimizer update on the device.

The update is memory-bound: for every parameter whose optimizer state this device holds it reads the
gradient and the states and writes the states and the weight back.  Mixed-precision Adam touches the
fp32 master weight, m and v (read + write, 2 x 12 B), the bf16 gradient (2 B) and writes the bf16
weight copy (2 B): 28 B per parameter; fp32 Adam reads/writes weight, m, v (2 x 12 B) and reads the
gradient (4 B): also 28 B.  Small per step for big dense models, but it dominates embedding-heavy
models (a 2B-row table updated densely every step) and it is what ZeRO-1+ divides by dp."""
from __future__ import annotations


def update_bytes_per_param(settings) -> float:
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


def optimizer_step_time(optimizer_state_bytes: float, param_bytes: float, cluster, settings) -> float:
    """Seconds per step for the device-side update of the parameters this device owns."""
    n = updated_params(optimizer_state_bytes, param_bytes, settings)
    if n <= 0:
        return 0.0
    return n * update_bytes_per_param(settings) / (cluster.mem_bandwidth * cluster.memory_efficiency)
