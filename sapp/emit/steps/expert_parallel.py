"""Step: expert parallelism -- experts spread over EP groups, kept out of the dp sync and synced over
expert-DP instead (sapp/emit/ep/experts.py)."""
from __future__ import annotations

from ..build import Build
from ..ep import experts as ep_mod


def apply(b: Build, s: int) -> None:
    if b.ep == 1:
        return
    mod = b.stages[s]
    names = ep_mod.apply(mod, b.ep, b.ep_groups[0], b.ep_groups[2])
    b.dp_excluded[s] = tuple(b.dp_excluded.get(s, ())) + tuple(names)
    named = dict(mod.named_parameters())
    b.expert_params[s] = [named[n] for n in names]
    b.hooks.append(ep_mod.ExpertGradSync(b.expert_params[s], b.ep_groups[1], b.dp, b.dp // b.ep))
