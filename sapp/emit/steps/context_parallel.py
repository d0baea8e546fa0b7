"""Step: context parallelism -- the attention rewritten for this rank's share of the tokens."""
from __future__ import annotations

from ..build import Layout, Rank
from ..cp import cp as cp_mod


def apply(model, layout: Layout, rank: Rank) -> None:
    """Before any pipeline trace: traced stages then run the cp attention (its K/V exchange is a
    custom operator export keeps) at this rank's token count and global positions.  Reads the
    layout's degrees and this rank's coords; rewrites `model`'s attention in place (nothing when cp = 1)."""
    if layout.cp == 1:
        return
    pp, dp, tp, cp = layout.pp, layout.dp // layout.cp, layout.tp, layout.cp
    cp_mod.apply(model, cp_mod.cp_group(rank.rank, pp, dp, cp, tp), cp, rank.coords[1] % cp)
