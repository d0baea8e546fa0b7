"""Step: optimizers -- one per stage as priced: host tables' and offloaded ones on the CPU
(sapp/emit/host/host.py), sparse tables' SparseAdam whole on every rank, ZeRO-1's states sharded
element-wise over dp (sapp/emit/dp/zero1.py; over expert-DP for the experts), ZeRO-0/2/3 plain."""
from __future__ import annotations

from ..build import Build
from ..dp import zero1
from ..host import host, sparse as sparse_mod
from ..pp import pipe as pipe_mod
from ..dp import wrap


def apply(b: Build, s: int) -> None:
    mod, lr, kind = b.stages[s], b.lr, b.optimizer
    sparse_ids = {id(p) for n, p in mod.named_parameters() if n in set(b.sparse_names[s])}
    if b.host_groups:
        opts = list(host.build_optimizers(mod, b.placement, lr, optimizer=kind,
                                          overrides={n: "sparse_adam" for n in b.sparse_names[s]},
                                          overlap=_offload_overlap(mod, b)))
        if b.local_zero1:     # the device part's optimizer states sharded over dp, as priced
            dense = [p for o in opts if o.sapp_where == "device" and o.sapp_kind != "sparse_adam"
                     for g in o.param_groups for p in g["params"]]
            opts = [o for o in opts if o.sapp_where != "device" or o.sapp_kind == "sparse_adam"]
            if dense:
                z1 = zero1.make(dense, kind, lr, b.mesh["dp"].get_group())
                z1.sapp_where = "device"
                opts.append(z1)
            b.zero = 1
        b.optimizers += opts
        return
    # sparse tables: SparseAdam, whole on every rank (priced so at any ZeRO stage); the rest below
    if sparse_ids:
        b.optimizers.append(sparse_mod.optimizer([p for p in mod.parameters() if id(p) in sparse_ids], lr))
    dense = [p for p in mod.parameters() if id(p) not in sparse_ids]
    if b.local_zero1 and b.expert_params.get(s):
        # ZeRO-1 over expert-DP for the experts (as priced), over dp for the rest
        b.zero = 1
        ex = {id(p) for p in b.expert_params[s]}
        b.optimizers.append(zero1.make([p for p in dense if id(p) not in ex], kind, lr, b.mesh["dp"].get_group()))
        b.optimizers.append(zero1.make(b.expert_params[s], kind, lr, b.ep_groups[1]))
    elif b.local_zero1:
        b.zero = 1
        b.optimizers.append(zero1.make(dense, kind, lr, b.mesh["dp"].get_group()))
    else:
        dp_group = b.mesh["dp"].get_group() if (b.dp > 1 and b.zero == 1) else None
        b.optimizers.append(wrap.make_optimizer(dense, kind, lr, zero=b.zero, dp_group=dp_group))


def _offload_overlap(mod, b: Build):
    """OffloadAdam's overlap as priced (sapp/placement/cost.py: per-group CPU Adam during the last
    backward) where gradients are final when backward accumulates them: no data-parallel sync (dp = 1).
    Pipeline-tied weights wait for their cross-stage sum (late); the schedule's 1/m scaling of the
    device gradients is applied on the host (grad_divisor).  None (step after backward) with dp > 1."""
    if b.dp > 1:
        return None
    m = int(b.plan.pipeline.get("micro_batches", 1) or 1)
    tied = {id(p) for h in b.hooks if isinstance(h, pipe_mod.TiedGrads) for ps, _ in h.ties for p in ps}
    late = [n for n, p in mod.named_parameters() if id(p) in tied]
    return {"accumulations": m, "blocks": b.blocks, "late": late, "grad_divisor": m if b.pp > 1 else 1}
