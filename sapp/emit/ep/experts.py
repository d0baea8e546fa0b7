"""Expert parallelism as priced (sapp/costmodel/moe.py): each MoE layer's experts spread over EP groups
of `ep` consecutive data-parallel ranks, routed rows sent to their expert's owner and back with
autograd-aware all_to_all_single (torch.distributed.nn.functional: its backward is the reverse
all-to-all; gloo runs it on CPU, uneven splits included), expert gradients all-reduced over the
expert-DP group only.

Contract with the model (sapp/models/moe.py): an MoE module has `E`, `w_in` [E, h, 2f], `w_out`
[E, f, h] and `experts_fn(rows, w_in, w_out, offs)` taking the rows sorted by expert with group ends
`offs`; this module swaps `experts_fn` and replaces the weights by this rank's slice.

Emitted for tp = 1, ZeRO-0 or ZeRO-1 (experts' optimizer states sharded over expert-DP,
sapp/emit/dp/zero1.py; what the joint search offers ep > 1 with), with or without pipeline stages;
anything else is a PlanError naming what to change.

Under a pipeline (pp > 1) the EP and expert-DP groups are a stage's own: the ep consecutive dp ranks of
one pipeline rank, and the dp / ep ranks of that rank holding the same experts (as
sapp/costmodel/moe.py prices them: the all-to-all never crosses a stage).  The traced stage modules
call each MoE layer as a sub-module (torch.export keeps the module call), so `eager_moe` puts a private
copy of the model's eager MoE module there, which `apply` then makes expert-parallel like pp = 1."""
from __future__ import annotations

import functools
import warnings

import torch
import torch.distributed as dist
from torch import nn

from ...errors import PlanError


def moe_modules(model: nn.Module) -> list:
    from ...models.moe import ep_capable
    return [(n, m) for n, m in model.named_modules() if ep_capable(m)]


def check(plan, model) -> int:
    """The plan's ep (1 when absent), refused where it is not emitted."""
    check_overlap(plan)
    par = plan.parallel
    ep = int(par.get("ep", 1) or 1)
    if ep == 1:
        return 1
    if par["tp"] > 1 or plan.zero not in (0, 1):
        raise PlanError(f"expert parallelism (ep={ep}) is emitted with tp=1 and zero 0 or 1 only; the plan has "
                        f"tp={par['tp']} zero={plan.zero}: pin ep=1 or those")
    if par["dp"] % ep:
        raise PlanError(f"ep={ep} must divide the plan's dp={par['dp']} (EP groups are dp ranks of one stage)")
    mods = moe_modules(model)
    if not mods:
        raise PlanError(f"the plan has ep={ep} but the model has no MoE layer (experts_fn, w_in, w_out); use ep 1")
    bad = [n for n, m in mods if m.E % ep]
    if bad:
        raise PlanError(f"ep={ep} must divide every MoE layer's expert count ({bad[0]} has {mods[0][1].E})")
    return ep


def check_overlap(plan) -> None:
    """A plan priced with Megatron-Core's --overlap-moe-expert-parallel-comm (settings.moe_a2a_overlap,
    sapp/pipeline/overlap.py) is refused in one line: this program runs each forward and backward
    whole, one after the other (torch's pipelining runs a paired forward and backward in sequence
    too), so every all-to-all is exposed.  A plan of an engine's runtime ("fused", torchtitan's) is
    already one the runtime check refuses (or, allowing the mismatch, re-prices as run: checks/manifest)."""
    st = plan._d.get("settings") or {}
    flags = [k for k in ("moe_a2a_overlap", "delay_wgrad") if st.get(k)]
    if flags and st.get("runtime", "eager") == "eager":
        raise PlanError(f"plan settings.{flags[0]} prices Megatron-Core's --overlap-moe-expert-parallel-comm (a "
                        f"micro-batch's MoE all-to-alls hidden behind another's compute), which sapp's own program does "
                        f"not run (it runs each forward and backward in turn): run the plan with Megatron-LM (`sapp "
                        f"export --to megatron`) or search again without --moe-a2a-overlap")


def eager_moe(stages: dict, model: nn.Module) -> int:
    """Each traced pipeline stage's MoE layers replaced by private copies of the model's eager ones
    (same names, same initial values); returns how many.  The traced graph calls them as sub-modules."""
    import copy
    n = 0
    for name, m in moe_modules(model):
        parent, _, child = name.rpartition(".")
        for mod in stages.values():
            try:
                owner = mod.get_submodule(parent) if parent else mod
            except AttributeError:
                continue
            if child in owner._modules:
                setattr(owner, child, copy.deepcopy(m))
                n += 1
    return n


def group_ranks(group) -> list:
    """The global ranks of a process group (the manifest records the EP group that runs)."""
    return list(dist.get_process_group_ranks(group)) if group is not None else []


def plan_group(plan, rank: int) -> list:
    """The EP group the plan prices for `rank`: the ep consecutive dp ranks of its own pipeline stage
    and tp index (rank = (pp_i * dp + dp_i) * tp + tp_i); [] when ep = 1."""
    par = plan.parallel
    ep, dp, tp = int(par.get("ep", 1) or 1), par["dp"], par["tp"]
    if ep == 1:
        return []
    p, d, t = rank // (dp * tp), (rank // tp) % dp, rank % tp
    first = d - d % ep
    return [(p * dp + first + j) * tp + t for j in range(ep)]


def groups(pp: int, dp: int, tp: int, ep: int, rank: int):
    """(EP group, expert-DP group, rank inside the EP group) for `rank`.  Every rank creates every
    group in the same order (new_group is collective)."""
    ep_g = edp_g = None
    me = None
    for p in range(pp):
        for t in range(tp):
            ranks = [(p * dp + d) * tp + t for d in range(dp)]
            for g0 in range(0, dp, ep):
                members = ranks[g0:g0 + ep]
                grp = dist.new_group(members)
                if rank in members:
                    ep_g, me = grp, members.index(rank)
            for j in range(ep):
                members = ranks[j::ep]
                grp = dist.new_group(members)
                if rank in members:
                    edp_g = grp
    return ep_g, edp_g, me


def _dispatch_experts(rows, w_in, w_out, offs, *, inner, group, ep, local):
    """rows [R, h] sorted by global expert (group ends offs[E]) -> expert outputs in the same order,
    computed by the experts' owners."""
    with warnings.catch_warnings():      # torch 2.13 flags it deprecated; it is the autograd-aware one
        warnings.simplefilter("ignore", FutureWarning)
        from torch.distributed.nn.functional import all_to_all_single as a2a

    def all_to_all_single(*a, **k):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return a2a(*a, **k)
    counts = torch.diff(offs, prepend=offs.new_zeros(1))                 # rows per global expert
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)             # [src, local expert] counts
    send = counts.view(ep, local).sum(1).tolist()
    rc = recv_counts.view(ep, local)
    recv = rc.sum(1).tolist()
    got = all_to_all_single(rows.new_empty(sum(recv), rows.shape[1]), rows, recv, send, group=group)
    # received rows run source-major; the grouped GEMM wants them expert-major
    starts = torch.cumsum(rc.reshape(-1), 0) - rc.reshape(-1)
    perm = torch.cat([torch.arange(int(starts[s * local + e]), int(starts[s * local + e] + rc[s, e]))
                      for e in range(local) for s in range(ep)]) if got.shape[0] else starts.new_zeros(0)
    y = inner(got[perm], w_in, w_out, torch.cumsum(rc.sum(0), 0))
    back = y[torch.argsort(perm)]
    return all_to_all_single(rows.new_empty(rows.shape[0], y.shape[1]), back, send, recv, group=group)


def apply(model: nn.Module, ep: int, ep_group, ep_rank: int) -> list:
    """Keep this rank's experts, dispatch by all-to-all; returns the expert parameters' names."""
    names = []
    for name, m in moe_modules(model):
        local = m.E // ep
        sl = slice(ep_rank * local, (ep_rank + 1) * local)
        m.w_in = nn.Parameter(m.w_in.detach()[sl].clone())
        m.w_out = nn.Parameter(m.w_out.detach()[sl].clone())
        m.experts_fn = functools.partial(_dispatch_experts, inner=m.experts_fn, group=ep_group, ep=ep, local=local)
        m.sapp_ep = ep
        m.sapp_ep_group = group_ranks(ep_group)       # what the manifest compares with the plan's layout
        names += [f"{name}.w_in" if name else "w_in", f"{name}.w_out" if name else "w_out"]
    return names


class ExpertGradSync:
    """After backward: expert gradients summed over the expert-DP group and divided by dp (each is
    already the sum over its EP group's tokens), i.e. the same mean over every dp rank's loss the
    dense parameters get."""

    def __init__(self, params, group, dp: int, edp: int):
        self.params, self.group, self.dp, self.edp = list(params), group, dp, edp

    def __call__(self):
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if self.edp > 1:
                dist.all_reduce(p.grad, group=self.group)
            p.grad /= self.dp
