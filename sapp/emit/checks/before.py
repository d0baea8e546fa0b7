"""The checks before the recipe's first step: a plan sapp cannot run as priced is refused here, on
every rank, before any process group, trace or collective (sapp/emit/recipe.py)."""
from __future__ import annotations

import torch.distributed as dist

from ...errors import PlanError
from ..cp import cp as cp_mod
from ..ep import experts as ep_mod
from . import buffers, plan as checks

# set a sharded region's stored head counts / widths to the rank's share (off only in tests that
# show what the shape audit catches without it)
LOCALISE = True


def run(model, plan, world: int, name: str, example, *, grad_sync: str, fingerprint: bool) -> tuple:
    """(plan, (notes, partial, parts)): the plan as a Plan and what the shape audit found -- its notes,
    the replicated parameters applied to a rank's share of a split axis, and the fused projections
    split by heads ({module: piece sizes}, sapp/emit/tp/fused.py)."""
    if grad_sync not in ("auto", "ddp", "allreduce"):
        raise PlanError(f"grad_sync must be 'auto', 'ddp' or 'allreduce', got {grad_sync!r}")
    plan = checks.as_plan(plan)
    graph = checks.check_all(model, plan, world, name, example, fingerprint=fingerprint)
    buffers.check(model, plan, example, graph)
    par = plan.parallel
    notes, partial, parts = [], [], {}
    if par["tp"] > 1 and checks.tp_groups(plan):
        # before any collective: local head counts set, then every op's shape at one rank's layer
        # shapes checked against the plan's split (sapp/emit/checks/shape_audit.py)
        from ..tp import sp as sp_mod
        from ..build import example_inputs
        from . import outside_reads, shape_audit
        ex = example_inputs(model, example, 2, "cpu")
        if par["pp"] == 1:
            # before the audit sets stored sizes to a rank's share: the whole model runs as it is
            outside_reads.check_plan(model, plan, ex)
        shape_audit.check(model, checks.tp_modules(plan), checks.tp_groups(plan), par["tp"], ex, notes,
                          fix=LOCALISE, partial=partial, sp_sec=sp_mod.section(plan) if par["pp"] == 1 else None,
                          parts=parts)
        _check_parts(plan, parts, notes)
    elif par["tp"] > 1 and any(v == "colwise" for v in checks.tp_modules(plan).values()):
        _refuse_hand_split_fused(model, plan, example)
    if world > 1 and not dist.is_initialized():
        raise PlanError("the plan needs several processes but torch.distributed is not initialised; launch with "
                        "`sapp run` / torchrun and call sapp.emit.runtime.dist.init() first")
    if par.get("cp", 1) > 1:
        cp_mod.check_plan(plan)
    ep_mod.check(plan, model)
    return plan, (notes, partial, parts)


def _check_parts(plan, found: dict, notes: list) -> None:
    """The fused projections the plan says it splits by heads are the ones the model has: the run
    follows the model (a reordering the plan leaves out would train wrong), and a plan that names
    other pieces was written for another model or edited."""
    said = (plan._d.get("tp_layout") or {}).get("parts") or {}
    if not isinstance(said, dict):
        raise PlanError("plan tp_layout.parts must map a module name to its pieces' sizes, e.g. "
                        "{\"layers.0.attn.qkv\": [512, 512, 512]}; search the plan again")
    for mod in sorted(set(said) | set(found)):
        if mod in said and list(said[mod]) != found.get(mod):
            raise PlanError(f"plan tp_layout.parts[{mod!r}] is {said[mod]} but the model's {mod} splits "
                            f"{'into ' + str(found[mod]) if mod in found else 'into no pieces a rank can hold'}; "
                            "search the plan again for this model")
        if mod not in said:
            notes.append(f"tp: {mod} is a fused projection cut into {found[mod]}: split by heads "
                         "(its rows put in rank order), though the plan does not say so")


def _refuse_hand_split_fused(model, plan, example) -> None:
    """A hand-written tp_modules (no tp_layout groups) splits column-wise layers as they are: one
    whose output the model cuts into q, k and v would hand rank 0 all of q and half of k, and train
    wrong.  Only sapp's searched layout splits such a projection by heads."""
    from ...capture import capture
    from ...search import tp_layout
    from ..build import example_inputs
    from .rank_capture import quiet, targets
    styles = checks.tp_modules(plan)
    ex = example_inputs(model, example, 2, "cpu")
    with quiet():
        graph = capture(model, ex, target=targets(model, ex))
    for node, sizes in sorted(tp_layout.fused_openers(graph).items()):
        mod = graph.nodes[node].module
        if styles.get(mod) == "colwise":
            raise PlanError(f"tp_modules[{mod!r}] is 'colwise', but the model cuts its output into pieces {sizes} "
                            "(a fused q/k/v): a hand-written layout cannot split it by heads; make it "
                            "'colwise_gather' or leave it out, or let `sapp search` write the layout")

