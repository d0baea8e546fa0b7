"""Model-state bytes of a profile unit's parameters (pipeline/profile.py): dense ones by the ZeRO formula,
sparse-gradient tables whole with the rows they touch as gradient (emit/sparse.py runs them so)."""
from __future__ import annotations

from ..costmodel import model_state_bytes, sparse_table_state_bytes


def unit_states(params, zero, settings, samples=1.0):
    """Model-state bytes of a unit's `params` (unit_params) at ZeRO `zero`; a sparse table's gradient
    holds the rows `samples` samples per rank touch (sparse_table_state_bytes)."""
    st = {"params": 0.0, "grads": 0.0, "optimizer": 0.0}
    for numel, k, _, trainable, sp in params:
        if not trainable:
            st["params"] += numel * settings.weight_bytes
            continue
        got = (sparse_table_state_bytes(numel, sp, samples, settings) if sp is not None
               else model_state_bytes(numel, k, zero, settings))
        for key, v in got.items():
            st[key] += v
    return st


def _sparse_grads_delta(params, settings, node_samples, samples):
    """Sparse tables' gradient bytes at `samples` samples per rank less what the per-node costs priced
    at the graph's own `node_samples` (costmodel.nodes prices one pass over its batch)."""
    d = 0.0
    for numel, _, _, trainable, sp in params:
        if trainable and sp is not None:
            d += (sparse_table_state_bytes(numel, sp, samples, settings)["grads"]
                  - sparse_table_state_bytes(numel, sp, node_samples, settings)["grads"])
    return d
