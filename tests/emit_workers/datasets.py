"""Dataset factories for `sapp run --data tests.emit_workers.datasets:NAME` (zero-argument callables)."""
from __future__ import annotations

import torch

N, SEQ, VOCAB = 48, 32, 256


def _rows():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, VOCAB, (N, SEQ + 1), generator=g)


class Tokens(torch.utils.data.Dataset):
    """Map-style: sample i is (ids[:-1], ids[1:]) of row i, for gpt-tiny."""

    def __init__(self):
        self.rows = _rows()

    def __len__(self):
        return N

    def __getitem__(self, i):
        r = self.rows[i]
        return r[:-1], r[1:]


class TokenStream(torch.utils.data.IterableDataset):
    """The same samples as Tokens, as an iterable."""

    def __iter__(self):
        for r in _rows():
            yield r[:-1], r[1:]


def tokens():
    return Tokens()


def token_stream():
    return TokenStream()


def not_a_dataset():
    return 42
