"""Stage partition: the count bisection and the DP are exact min-max (checked by brute force)."""
import itertools
import math
import random

import pytest

from sapp.pipeline.partition import partition_counts, partition_dp


def _brute(n, p, cut, seg):
    best = math.inf
    cuts = [j for j in range(1, n) if cut[j]]
    for cs in itertools.combinations(cuts, p - 1):
        starts = [0] + list(cs)
        ends = list(cs) + [n]
        vals = [seg(i, a, b) for i, (a, b) in enumerate(zip(starts, ends))]
        if all(f for _, f in vals):
            best = min(best, max(t for t, _ in vals))
    return best


def _instance(seed):
    rnd = random.Random(seed)
    n = rnd.randint(2, 9)
    p = rnd.randint(1, min(n, 4))
    w = [rnd.uniform(0.1, 2) for _ in range(n)]
    mem = [rnd.uniform(0, 1) for _ in range(n)]
    cap = rnd.uniform(1, 4)
    cut = [True] + [rnd.random() < 0.8 for _ in range(n - 1)]

    def seg(i, a, b):   # later stages hold fewer micro-batches (1F1B), so stage matters
        return sum(w[a:b]) * (1 + 0.1 * i), sum(mem[a:b]) * (p - i) <= cap * 2
    return n, p, cut, seg


@pytest.mark.parametrize("seed", range(60))
def test_dp_matches_brute_force(seed):
    n, p, cut, seg = _instance(seed)
    starts, t = partition_dp(n, p, cut, seg)
    ref = _brute(n, p, cut, seg)
    if ref == math.inf:
        assert starts is None
    else:
        assert t == pytest.approx(ref)
        assert starts[0] == 0 and len(starts) == p and all(cut[s] for s in starts[1:])


@pytest.mark.parametrize("seed", range(150))
def test_counts_match_dp_for_identical_blocks(seed):
    rnd = random.Random(seed)
    L = rnd.randint(1, 14)
    p = rnd.randint(1, min(L, 6))
    w, pro, epi = rnd.uniform(0.5, 2), rnd.uniform(0, 3), rnd.uniform(0, 3)
    mem, cap = rnd.uniform(0.1, 1), rnd.uniform(1, 6)

    def seg_k(i, k):
        t = k * w * (1 + 0.1 * i) + (pro if i == 0 else 0) + (epi if i == p - 1 else 0)
        return t, k * mem * (p - i) <= cap

    n = L + 2
    cut = [True] + [False] + [True] * (L - 1) + [False]

    def seg(i, a, b):
        k = sum(1 for j in range(a, b) if 1 <= j <= L)
        if k == 0:
            return 0.0, False
        t = k * w * (1 + 0.1 * i) + (pro if a == 0 else 0) + (epi if b == n else 0)
        return t, k * mem * (p - i) <= cap

    counts, t1 = partition_counts(L, p, seg_k)
    starts, t2 = partition_dp(n, p, cut, seg)
    assert (counts is None) == (starts is None)
    if counts is not None:
        assert sum(counts) == L and min(counts) >= 1
        assert t1 == pytest.approx(t2, rel=1e-9)


def test_too_few_blocks_for_the_stages():
    assert partition_counts(3, 4, lambda i, k: (k, True)) == (None, math.inf)
