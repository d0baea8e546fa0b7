"""Tensor-parallel communication overlapped with its GEMM (runtime "fused+tp-overlap").

Megatron-Core's `--tp-comm-overlap` (Transformer Engine's userbuffers) splits a tensor-parallel
linear layer's collective into chunks and pipelines them against the GEMM: the sequence-parallel
all-gather before a column-parallel linear against that linear's GEMM (the chunk k + 1 travels while
chunk k is multiplied), the reduce-scatter after a row-parallel linear against the GEMM that produces
it, and the same pairs in backward (the gradient's reduce-scatter / all-gather against the dgrad and
wgrad GEMMs).  With n chunks (one per tp rank in the ring exchange) a collective of `comm` seconds
beside a GEMM of `gemm` seconds takes

    comm / n + (n - 1) * max(comm, gemm) / n + gemm / n

so the first (or last) chunk's transfer stays exposed, and whatever the transfer exceeds the GEMM by.
Assumed: the chunked GEMM runs at the whole GEMM's efficiency, the collective uses its own SMs / copy
engines without slowing the GEMM (what the userbuffers design aims at; sapp's emitter runs neither:
plans priced with this runtime are predictions for Megatron-Core, `sapp run` refuses them)."""
from __future__ import annotations


def exposed(comm_s: float, gemm_s: float, chunks: int) -> float:
    """Seconds of a `comm_s` collective left exposed when pipelined in `chunks` pieces against a
    GEMM of `gemm_s` seconds (formula above)."""
    if comm_s <= 0:
        return 0.0
    n = max(1, int(chunks))
    return comm_s / n + (n - 1) * max(0.0, comm_s - gemm_s) / n


def hide(edges, gemm_time, chunks_of):
    """Seconds hidden per edge: `edges` [(key, producer, consumer, fwd_s, bwd_s)] in graph order;
    `gemm_time` node -> [fwd_s, bwd_s] of the tensor-parallel linear layers (their compute, a budget
    each edge beside them draws from: one GEMM hides at most its own time); `chunks_of(key)` the ring
    size.  An edge pairs with its consumer when that is a linear layer (the all-gather before a
    column-parallel linear), else with its producer (the reduce-scatter after a row-parallel one).
    Returns {key: (fwd hidden, bwd hidden)}."""
    out = {}
    for key, prod, cons, f, b in edges:
        partner = cons if cons in gemm_time else prod if prod in gemm_time else None
        if partner is None:
            continue
        budget = gemm_time[partner]
        n = chunks_of(key)
        hf = f - exposed(f, budget[0], n)
        hb = b - exposed(b, budget[1], n)
        budget[0] -= hf
        budget[1] -= hb
        out[key] = (hf, hb)
    return out
