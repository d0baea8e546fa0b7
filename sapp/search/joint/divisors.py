"""Divisors of device counts, batches and block counts."""
from __future__ import annotations


def divisors(n):
    """Divisors of n in increasing order, in O(sqrt n) steps (device counts and batches can be huge)."""
    if n < 1:
        return []
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]
