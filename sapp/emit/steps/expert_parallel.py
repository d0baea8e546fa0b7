"""Step: expert parallelism -- experts spread over EP groups, kept out of the dp sync and synced over
expert-DP instead (sapp/emit/ep/experts.py)."""
from __future__ import annotations

from ..build import Layout, Made
from ..ep import experts as ep_mod


def apply(layout: Layout, made: Made, s: int) -> None:
    """Reads the layout's ep, EP groups and dp; spreads stage `s`'s experts (`made.stages[s]`) in
    place and writes `made.dp_excluded[s]` (the experts added), `made.expert_params[s]` and their
    expert-DP gradient hook in `made.hooks`.  Nothing when ep = 1."""
    if layout.ep == 1:
        return
    mod, groups = made.stages[s], layout.ep_groups
    names = ep_mod.apply(mod, layout.ep, groups[0], groups[2])
    made.dp_excluded[s] = tuple(made.dp_excluded.get(s, ())) + tuple(names)
    named = dict(mod.named_parameters())
    made.expert_params[s] = [named[n] for n in names]
    made.hooks.append(ep_mod.ExpertGradSync(made.expert_params[s], groups[1], layout.dp, layout.dp // layout.ep))
