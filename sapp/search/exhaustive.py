"""Exhaustive enumeration of every strategy combination (tiny graphs only: the checker of the
checkers).  Vectorised over the last variable."""
from __future__ import annotations

import itertools

import numpy as np

from ..errors import SappError
from .recursive import full_mrf

MAX_COMBINATIONS = 5_000_000


def exhaustive_search(prob):
    S, mrf = full_mrf(prob)
    n = len(S)
    total = 1
    for s in S:
        total *= len(s)
    if total > MAX_COMBINATIONS:
        raise SappError(f"exhaustive search would enumerate {total:.3g} combinations (limit {MAX_COMBINATIONS:.0e}); "
                        "use method='exact' or 'recursive'")
    last = n - 1
    best, best_x = np.inf, None
    head_pairs = [(u, v, M) for (u, v), M in mrf.pairs.items() if v != last and u != last]
    tail_pairs = [(u if v == last else v, M if v == last else M.T) for (u, v), M in mrf.pairs.items()
                  if last in (u, v)]
    for combo in itertools.product(*[range(len(s)) for s in S[:last]]):
        e = sum(mrf.U[v][combo[v]] for v in range(last)) + sum(M[combo[u], combo[v]] for u, v, M in head_pairs)
        vec = mrf.U[last].copy()
        for u, M in tail_pairs:
            vec += M[combo[u]]
        j = int(vec.argmin())
        if e + vec[j] < best - 1e-15:
            best, best_x = e + vec[j], list(combo) + [j]
    return [S[v][best_x[v]] for v in range(n)]
