"""Least-squares α-β fits of collective times (pure)."""
from __future__ import annotations

from .config import CalibrationError


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
