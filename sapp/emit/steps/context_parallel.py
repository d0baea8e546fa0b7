"""Step: context parallelism -- the attention rewritten for this rank's share of the tokens."""
from __future__ import annotations

from ..build import Build
from ..cp import cp as cp_mod


def apply(b: Build) -> None:
    """Before any pipeline trace: traced stages then run the cp attention (its K/V exchange is a
    custom operator export keeps) at this rank's token count and global positions."""
    if b.cp == 1:
        return
    pp, dp, tp = b.pp, b.dp // b.cp, b.tp
    cp_mod.apply(b.model, cp_mod.cp_group(b.rank, pp, dp, b.cp, tp), b.cp, b.coords[1] % b.cp)
