"""Roofline compute time, alpha-beta ring collectives, model-state bytes (REFERENCE.md section 2)."""
from __future__ import annotations

from ..errors import SappError

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")


def compute_time(flops: float, nbytes: float, cluster) -> float:
    """Roofline: the slower of the arithmetic and the memory traffic, at the cluster's efficiencies."""
    t_c = flops / (cluster.peak_flops * cluster.compute_efficiency) if flops > 0 else 0.0
    t_m = nbytes / (cluster.mem_bandwidth * cluster.memory_efficiency) if nbytes > 0 else 0.0
    return t_c if t_c > t_m else t_m


def link_params(link: str, cluster):
    if link == "intra":
        return cluster.intra_latency, cluster.intra_bw
    if link == "inter":
        return cluster.inter_latency, cluster.inter_bw
    raise SappError(f"link must be 'intra' or 'inter', got {link!r}")


def collective_time(kind: str, nbytes: float, n: int, link: str, cluster) -> float:
    """Ring alpha-beta time of one collective over `n` ranks.  `nbytes` is the full buffer for
    all_reduce / all_gather (output) / reduce_scatter (input); the per-rank send buffer for
    all_to_all; the message for p2p."""
    if kind not in COLLECTIVES:
        raise SappError(f"unknown collective {kind!r}; use one of {', '.join(COLLECTIVES)}")
    alpha, beta = link_params(link, cluster)
    if kind == "p2p":
        return alpha + nbytes / beta if nbytes > 0 else 0.0
    if n <= 1 or nbytes <= 0:
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / beta
    return (n - 1) * alpha + (n - 1) / n * nbytes / beta


def model_state_bytes(n_params: float, dp: int, zero: int, settings) -> dict:
    """Per-device bytes of weights, gradients and optimizer state for `n_params` (already divided by
    tensor sharding) when the gradient-sync group has `dp` ranks and ZeRO stage `zero` is used."""
    w, g, k = settings.weight_bytes, settings.grad_bytes, settings.optimizer_bytes
    dp = max(1, int(dp))
    params, grads, opt = w * n_params, g * n_params, k * n_params
    if zero >= 1:
        opt /= dp
    if zero >= 2:
        grads /= dp
    if zero >= 3:
        params /= dp
    return {"params": params, "grads": grads, "optimizer": opt}
