"""Step: host and sparse embedding tables -- kept out of DDP/FSDP (which cannot bucket sparse
gradients), their gradients averaged over dp by hooks of their own (sapp/emit/host/)."""
from __future__ import annotations

from ..build import Build
from ..host import host, sparse as sparse_mod
from ..dp import wrap


class HostSync:
    """After backward: average host tables' sparse gradients over the dp group (they are kept out of
    DDP/FSDP, which cannot bucket CPU sparse gradients next to device ones)."""

    def __init__(self, module, section, group):
        self.module, self.section, self.group = module, section, group

    def __call__(self):
        host.sync_host_grads(self.module, self.section, group=self.group)


def apply(b: Build, s: int) -> None:
    mod, names = b.stages[s], ()
    if b.host_groups and b.dp > 1:
        names = tuple(host.ignore_host_params_in_ddp(mod, b.placement))
        if names:
            b.hooks.append(HostSync(mod, b.placement, wrap.gloo_dp_group(b.mesh, b.device, b.pp, b.dp, b.tp)))
    b.sparse_names[s] = sparse_mod.table_names(mod)
    if b.sparse_names[s] and b.dp > 1:     # device sparse tables: outside DDP/FSDP, rows all-gathered
        named = dict(mod.named_parameters())
        b.hooks.append(sparse_mod.SparseGradSync([named[n] for n in b.sparse_names[s]], b.mesh["dp"].get_group()))
        names = tuple(names) + tuple(b.sparse_names[s])
    b.dp_excluded[s] = names
