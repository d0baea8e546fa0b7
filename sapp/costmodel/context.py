"""Context parallelism (CP): what splitting the sequence over `cp` ranks costs, for the whole layer.

Choice (Llama 3's, "The Llama 3 Herd of Models" §3.3.2): every rank keeps its tokens' queries and
all-gathers the keys and values of the whole sequence before attention (forward), and reduce-scatters
their gradients (backward).  With grouped-query attention K and V are a small fraction of the layer's
activations (8 KV heads against 128 query heads for Llama-3-405B), so the exchange is cheap, and it
works with any attention kernel and any mask; a ring exchange overlapped with the attention compute
would hide it but needs a kernel that accumulates partial softmaxes.  Priced exposed (not overlapped),
which is what the emitted all-gather does (sapp/emit/cp/cp.py).

Causal load balancing: the sequence is cut into 2·cp equal chunks and rank r holds chunks r and
2·cp-1-r.  Then every rank attends to exactly 1/cp of the causal (query, key) pairs
(`causal_pairs_share`), so the attention work of a rank is 1/cp of the whole layer's, like every
token-wise op: a CP configuration costs what the same layer costs on 1/cp of the tokens, plus the
K/V exchange.  Contiguous chunks would leave the last rank with (2cp-1)/cp² of the pairs.

Parameters are replicated over cp; their gradients are averaged over dp x cp (ZeRO shards over
dp x cp).  Pure functions: plain values in, numbers out."""
from __future__ import annotations

from .primitives import collective_time


def balanced_chunks(cp: int, rank: int) -> tuple:
    """The two sequence chunks (of 2·cp) rank `rank` holds under load-balanced causal chunking."""
    return (rank, 2 * cp - 1 - rank)


def chunk_positions(seq: int, cp: int, rank: int) -> list:
    """Global token positions a CP rank holds, in its local order (chunk r, then chunk 2cp-1-r)."""
    c = seq // (2 * cp)
    out = []
    for k in balanced_chunks(cp, rank):
        out.extend(range(k * c, (k + 1) * c))
    return out


def causal_pairs(positions) -> int:
    """(query, key) pairs a causal mask keeps for queries at `positions`: query i sees keys 0..i."""
    return sum(p + 1 for p in positions)


def causal_pairs_share(seq: int, cp: int, rank: int, balanced: bool = True) -> float:
    """Fraction of the whole sequence's causal pairs rank `rank` computes (a kernel that skips masked
    blocks does work in proportion to it).  Balanced chunking gives exactly 1/cp to every rank."""
    if balanced:
        pos = chunk_positions(seq, cp, rank)
    else:
        c = seq // cp
        pos = range(rank * c, (rank + 1) * c)
    return causal_pairs(pos) / (seq * (seq + 1) / 2)


def worst_rank_share(seq: int, cp: int, balanced: bool = True) -> float:
    """The busiest rank's share of the causal pairs: what the step waits for."""
    return max(causal_pairs_share(seq, cp, r, balanced) for r in range(cp))


def cp_link(cp: int, tp: int, gpus_per_node: int) -> str:
    """The cp group's link.  Mesh order (pp, dp, cp, tp): a cp group's ranks are tp apart, so it
    spans cp·tp consecutive devices and stays inside a node while that fits."""
    return "intra" if cp * tp <= gpus_per_node else "inter"


def kv_exchange_time(kv_bytes: float, cp: int, link: str, cluster) -> tuple:
    """(forward, backward) seconds of one layer's K/V exchange.  `kv_bytes`: this rank's K and V of
    the WHOLE sequence (its micro-batch, its tensor-parallel heads, activation width) - the
    all-gather's output; the backward reduce-scatters the same bytes of gradients."""
    if cp <= 1 or kv_bytes <= 0:
        return 0.0, 0.0
    return (collective_time("all_gather", kv_bytes, cp, link, cluster),
            collective_time("reduce_scatter", kv_bytes, cp, link, cluster))


def kv_saved_bytes(kv_bytes: float, cp: int, local_bytes: float | None = None, out_bytes: float = 0.0) -> float:
    """Extra activation bytes a layer keeps under CP.  The attention saves the K and V it multiplies
    by for backward: on one device (and at 1/cp of the tokens, as the profile prices a cp rank) those
    are this rank's own K and V (`local_bytes`, default kv_bytes / cp); under CP the gathered
    whole-sequence ones (`kv_bytes`, in the form the cp attention saves them) instead.  `out_bytes`: a
    copy of the attention output the cp program makes (a fused kernel run per local chunk, the
    chunks concatenated).  Without either: (cp-1)/cp of `kv_bytes` (measured: gpt-tiny cp=2 saves
    64 KB more than dp=2 at the same tokens per rank, kv_bytes/2 = 65.5 KB)."""
    if cp <= 1:
        return 0.0
    local = kv_bytes / cp if local_bytes is None else local_bytes
    return kv_bytes - local + out_bytes


def check_sequence(seq: int, cp: int) -> bool:
    """Load-balanced chunking needs the sequence to divide into 2·cp equal chunks."""
    return cp == 1 or (seq > 0 and seq % (2 * cp) == 0)
