"""Contiguous stage partition (Alpa-style min-max over stage time, memory-constrained).

Stages differ (the first holds the prologue, the last the epilogue, 1F1B keeps fewer micro-batches
in flight on later stages), so a greedy longest-prefix fill is not exact.  Two exact methods:
`partition_counts` for identical blocks (a count per stage, bisection on the bottleneck) and
`partition_dp`, the O(p n^2) dynamic program over cut points for anything else."""
from __future__ import annotations

import math


def partition_counts(L, p, seg_k, rel_tol=1e-6, kmin=1):
    """Identical blocks: stage i holds k_i >= kmin blocks (the first stage also the prologue, the last
    the epilogue; `seg_k(i, k) -> (time, fits)` prices that; `kmin` = v for interleaving, whose
    stages split into v chunks of at least one block, or a list of per-stage minima: `stage_kmins`).
    The first and last stages may hold fewer blocks than the others (the embedding / head + loss make them heavier): nothing forces equal
    counts.  For a bottleneck X stage i can hold at
    most K_i(X) blocks (time and memory grow with k), and a partition with bottleneck <= X exists
    iff sum_i K_i(X) >= L: exact.  Bisection on X over the candidate stage times.
    Returns (counts, bottleneck) or (None, inf)."""
    kmins = list(kmin) if isinstance(kmin, (list, tuple)) else [kmin] * p
    if L < sum(kmins):
        return None, math.inf
    cache = {}

    def sk(i, k):
        key = (i, k)
        if key not in cache:
            cache[key] = seg_k(i, k)
        return cache[key]

    def kmax(i, X):
        lo, hi, best = kmins[i], L - (sum(kmins) - kmins[i]), 0
        while lo <= hi:
            mid = (lo + hi) // 2
            t, fits = sk(i, mid)
            if fits and t <= X:
                best = mid
                lo = mid + 1
            else:
                hi = mid - 1
        return best

    def ok(X):
        ks = [kmax(i, X) for i in range(p)]
        return ks if all(k >= km for k, km in zip(ks, kmins)) and sum(ks) >= L else None

    ks = ok(math.inf)
    if ks is None:
        return None, math.inf
    hi = max(sk(i, k)[0] for i, k in enumerate(_trim(ks, L, sk, kmins)))
    # the first and last stages hold at least their minimum of blocks each (and the glue)
    lo = max(sk(0, kmins[0])[0], sk(p - 1, kmins[-1])[0]) * (1 - 1e-12)
    if not (sk(0, kmins[0])[1] and sk(p - 1, kmins[-1])[1]):
        lo = 0.0
    while hi - lo > rel_tol * hi:
        # exact stop: nothing strictly below the current bottleneck fits
        if ok(hi * (1 - 1e-12)) is None:
            break
        mid = (lo + hi) / 2
        r = ok(mid)
        if r is None:
            lo = mid
        else:
            ks = r
            hi = max(sk(i, k)[0] for i, k in enumerate(_trim(r, L, sk, kmins)))
    counts = _trim(ks, L, sk, kmins)
    return counts, max(sk(i, k)[0] for i, k in enumerate(counts))


def _trim(ks, L, sk, kmin=1):
    """Reduce per-stage maxima to counts summing to L: repeatedly take a block from the slowest
    stage that has more than its minimum (ties: the lowest index)."""
    import heapq
    ks = list(ks)
    kmins = list(kmin) if isinstance(kmin, (list, tuple)) else [kmin] * len(ks)
    excess = sum(ks) - L
    heap = [(-sk(i, k)[0], i) for i, k in enumerate(ks) if k > kmins[i]]
    heapq.heapify(heap)
    while excess > 0:
        _, i = heapq.heappop(heap)
        ks[i] -= 1
        excess -= 1
        if ks[i] > kmins[i]:
            heapq.heappush(heap, (-sk(i, ks[i])[0], i))
    return ks


def chunk_counts(k, v, end=None):
    """Blocks of each of the v chunks of a stage holding k >= v blocks: as equal as they go, the
    extra blocks on the middle chunks first (chunk 0 of the first stage carries the embedding and
    the last chunk of the last stage the head and the loss), then the last, then the first.
    `end` "first" / "last": the first / last stage of a glue-chunk layout (`stage_kmins`), which may
    hold k = v - 1 blocks: its chunk 0 (first) or chunk v - 1 (last) then holds the glue alone."""
    if v >= 2 and k == v - 1 and end in ("first", "last"):
        rest = chunk_counts(k, v - 1) if k >= 1 else []
        return [0] + rest if end == "first" else rest + [0]
    if v < 1 or k < v:
        raise ValueError(f"{k} blocks cannot form {v} chunks")
    base, extra = divmod(k, v)
    order = list(range(1, v - 1)) + ([v - 1, 0] if v > 1 else [0])
    out = [base] * v
    for c in order[:extra]:
        out[c] += 1
    return out


def stage_end(i, p):
    """'first' / 'last' / None: which end of a p-stage pipeline stage i is (chunk_counts' `end`)."""
    return "first" if i == 0 else "last" if i == p - 1 else None


def stage_kmins(L, p, v, prologue=True, epilogue=True):
    """Least blocks per stage of an interleaved pipeline of p stages with v chunks each: v, or, when
    p * v > L (a pinned v the L blocks cannot give every stage), Llama 3's layout: the first and the
    last stage hold one block fewer and their first / last chunk holds only the embedding / the
    output projection and loss ("The Llama 3 Herd of Models", Dubey et al. 2024, section 3.3.2: "the
    first model chunk on the first stage has only the embedding, and the last model chunk on the last
    stage has only output projection and loss calculation").  An end without glue (`prologue` /
    `epilogue` False) keeps v.  None when even that leaves too few blocks."""
    km = [v] * p
    if L < p * v and p >= 2:
        km[0] -= 1 if prologue else 0
        km[-1] -= 1 if epilogue else 0
    return km if L >= sum(km) else None


def glue_chunks(counts, v) -> bool:
    """Whether an interleaved layout of these per-stage block counts has a glue-only chunk."""
    return v > 1 and any(k < v for k in counts)


def interleaved_layout(counts, v):
    """Virtual stages of an interleaved pipeline in model order: [(device, chunk, blocks)], where
    stage i holds counts[i] blocks in v chunks and virtual stage c * p + i is chunk c of device i
    (what torch.distributed.pipelining runs on pp rank i)."""
    p = len(counts)
    per = [chunk_counts(k, v, stage_end(i, p)) for i, k in enumerate(counts)]
    return [(i, c, per[i][c]) for c in range(v) for i in range(p)]


def dualpipev_layout(counts, v=2):
    """DualPipeV's stages in model order: [(device, chunk, blocks)], stage s < p being chunk 0 of
    device s and stage s >= p chunk 1 of device 2p - 1 - s (the V torch's ScheduleDualPipeV runs)."""
    p = len(counts)
    per = [chunk_counts(k, 2) for k in counts]
    return [(s, 0, per[s][0]) if s < p else (2 * p - 1 - s, 1, per[2 * p - 1 - s][1]) for s in range(2 * p)]


def partition_dp(n, p, cut_before, seg):
    """Exact min-max (ties: least total) contiguous partition by dynamic programming."""
    INF = (math.inf, math.inf)
    # f[i][j]: best (max, sum) for units [0, j) in i+1 stages
    f = [[INF] * (n + 1) for _ in range(p)]
    arg = [[None] * (n + 1) for _ in range(p)]
    for j in range(1, n + 1):
        if j == n or cut_before[j]:
            t, fits = seg(0, 0, j)
            if fits:
                f[0][j] = (t, t)
    for i in range(1, p):
        for j in range(1, n + 1):
            if j != n and not cut_before[j]:
                continue
            for k in range(1, j):
                if not cut_before[k] or f[i - 1][k] == INF:
                    continue
                t, fits = seg(i, k, j)
                if not fits:
                    continue
                prev = f[i - 1][k]
                cand = (max(prev[0], t), prev[1] + t)
                if cand < f[i][j]:
                    f[i][j] = cand
                    arg[i][j] = k
    if f[p - 1][n] == INF:
        return None, math.inf
    return backtrack_starts(arg, p, n), f[p - 1][n][0]


def backtrack_starts(arg, p, n):
    """Stage starts of a cut-point program's optimum: `arg[i][j]` is where stage i begins when
    stages 0..i hold units [0, j)."""
    starts, j = [], n
    for i in range(p - 1, 0, -1):
        j = arg[i][j]
        starts.append(j)
    starts.append(0)
    return starts[::-1]
