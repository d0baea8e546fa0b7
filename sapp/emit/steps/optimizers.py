"""Step: optimizers -- one per stage as priced: host tables' and offloaded ones on the CPU
(sapp/emit/host/host.py), sparse tables' SparseAdam whole on every rank, ZeRO-1's states sharded
element-wise over dp (sapp/emit/dp/zero1.py; over expert-DP for the experts), ZeRO-0/2/3 plain."""
from __future__ import annotations

from ..build import Layout, Made, Placement, Rank, RecomputePlan, Training
from ..dp import zero1
from ..host import host, sparse as sparse_mod
from ..pp import pipe as pipe_mod
from ..dp import wrap


def apply(plan, layout: Layout, rank: Rank, training: Training, placement: Placement, recompute: RecomputePlan,
          made: Made, s: int) -> None:
    """Reads stage `s` as wrapped (`made.stages[s]`: FSDP2 swapped its parameters), its sparse tables
    and experts (`made.sparse_names[s]`, `made.expert_params[s]`), the training's optimizer and lr,
    the layout (dp, ZeRO), the mesh, the placement section; appends to `made.optimizers` and sets
    `made.zero` to 1 where ZeRO-1 shards the states here."""
    mod, lr, kind = made.stages[s], training.lr, training.optimizer
    mesh = rank.mesh
    sparse_ids = {id(p) for n, p in mod.named_parameters() if n in set(made.sparse_names[s])}
    if placement.host_groups:
        opts = list(host.build_optimizers(mod, placement.section, lr, optimizer=kind,
                                          overrides={n: "sparse_adam" for n in made.sparse_names[s]},
                                          overlap=_offload_overlap(mod, plan, layout, recompute, made)))
        if layout.local_zero1:     # the device part's optimizer states sharded over dp, as priced
            dense = [p for o in opts if o.sapp_where == "device" and o.sapp_kind != "sparse_adam"
                     for g in o.param_groups for p in g["params"]]
            opts = [o for o in opts if o.sapp_where != "device" or o.sapp_kind == "sparse_adam"]
            if dense:
                z1 = zero1.make(dense, kind, lr, mesh["dp"].get_group())
                z1.sapp_where = "device"
                opts.append(z1)
            made.zero = 1
        made.optimizers += opts
        return
    # sparse tables: SparseAdam, whole on every rank (priced so at any ZeRO stage); the rest below
    if sparse_ids:
        made.optimizers.append(sparse_mod.optimizer([p for p in mod.parameters() if id(p) in sparse_ids], lr))
    dense = [p for p in mod.parameters() if id(p) not in sparse_ids]
    if layout.local_zero1 and made.expert_params.get(s):
        # ZeRO-1 over expert-DP for the experts (as priced), over dp for the rest
        made.zero = 1
        ex = {id(p) for p in made.expert_params[s]}
        made.optimizers.append(zero1.make([p for p in dense if id(p) not in ex], kind, lr, mesh["dp"].get_group()))
        made.optimizers.append(zero1.make(made.expert_params[s], kind, lr, layout.ep_groups[1]))
    elif layout.local_zero1:
        made.zero = 1
        made.optimizers.append(zero1.make(dense, kind, lr, mesh["dp"].get_group()))
    else:
        dp_group = mesh["dp"].get_group() if (layout.dp > 1 and made.zero == 1) else None
        made.optimizers.append(wrap.make_optimizer(dense, kind, lr, zero=made.zero, dp_group=dp_group))


def _offload_overlap(mod, plan, layout: Layout, recompute: RecomputePlan, made: Made):
    """OffloadAdam's overlap as priced (sapp/placement/cost.py: per-group CPU Adam during the last
    backward) where gradients are final when backward accumulates them: no data-parallel sync (dp = 1).
    Pipeline-tied weights wait for their cross-stage sum (late); the schedule's 1/m scaling of the
    device gradients is applied on the host (grad_divisor).  None (step after backward) with dp > 1,
    and under dualpipev: torch's weight-gradient actions (pipelining._backward.stage_backward_weight)
    assign `.grad` directly, firing no accumulate hook."""
    if layout.dp > 1 or plan.pipeline.get("schedule") == "dualpipev":
        return None
    m = int(plan.pipeline.get("micro_batches", 1) or 1)
    tied = {id(p) for h in made.hooks if isinstance(h, pipe_mod.TiedGrads) for ps, _ in h.ties for p in ps}
    late = [n for n, p in mod.named_parameters() if id(p) in tied]
    return {"accumulations": m, "blocks": recompute.blocks, "late": late, "grad_divisor": m if layout.pp > 1 else 1}
