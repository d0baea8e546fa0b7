"""Step: host and sparse embedding tables -- kept out of DDP/FSDP (which cannot bucket sparse
gradients), their gradients averaged over dp by hooks of their own (sapp/emit/host/)."""
from __future__ import annotations

from ..build import Layout, Made, Placement, Rank
from ..host import host, sparse as sparse_mod
from ..dp import wrap


class HostSync:
    """After backward: average host tables' sparse gradients over the dp group (they are kept out of
    DDP/FSDP, which cannot bucket CPU sparse gradients next to device ones)."""

    def __init__(self, module, section, group):
        self.module, self.section, self.group = module, section, group

    def __call__(self):
        host.sync_host_grads(self.module, self.section, group=self.group)


def apply(layout: Layout, rank: Rank, placement: Placement, made: Made, s: int) -> None:
    """Reads stage `s` (`made.stages[s]`), the layout's degrees, this rank's mesh and device and the
    placement section; writes `made.sparse_names[s]`, `made.dp_excluded[s]` (host and sparse tables)
    and their gradient hooks in `made.hooks` (only when dp > 1)."""
    mod, names = made.stages[s], ()
    dp, mesh = layout.dp, rank.mesh
    if placement.host_groups and dp > 1:
        names = tuple(host.ignore_host_params_in_ddp(mod, placement.section))
        if names:
            group = wrap.gloo_dp_group(mesh, rank.device, layout.pp, dp, layout.tp)
            made.hooks.append(HostSync(mod, placement.section, group))
    made.sparse_names[s] = sparse_mod.table_names(mod)
    if made.sparse_names[s] and dp > 1:     # device sparse tables: outside DDP/FSDP, rows all-gathered
        named = dict(mod.named_parameters())
        made.hooks.append(sparse_mod.SparseGradSync([named[n] for n in made.sparse_names[s]], mesh["dp"].get_group()))
        names = tuple(names) + tuple(made.sparse_names[s])
    made.dp_excluded[s] = names
