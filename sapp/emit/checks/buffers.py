"""Buffers the forward writes from the batch, under a layout that splits the batch.

An EMA of activations, or a running statistic of a class of its own, is updated in forward from the
batch the module sees (capture/batchy.py reads them off the exported program: `batch_buffers`).
One process updates it once a step from the whole batch; under dp or cp each rank would update it
from its own part, and under micro-batches once per micro-batch (an EMA model under dp2: 2.3e-4 off
one process after 3 steps, in float64 too).  sapp cannot reduce an arbitrary update over the ranks,
so such a plan is refused here, before the first step, in one line naming the buffer; the search
plans none (search/joint/configs.py).  torch BatchNorms are not here: their statistics are synced
over dp (emit/dp/batch_stats.py) and checked by plan.check_batch_statistics."""
from __future__ import annotations

from ...errors import PlanError


def splits_batch(plan) -> str | None:
    """Why `plan`'s ranks or micro-batches do not each see the whole batch, or None."""
    par = plan.parallel
    m = (plan.pipeline or {}).get("micro_batches", 1) or 1
    if par["dp"] > 1:
        return f"dp={par['dp']} gives each rank a part of the batch"
    if par.get("cp", 1) > 1:
        return f"cp={par['cp']} gives each rank a part of every sample"
    if m > 1:
        return f"micro_batches={m} runs the forward once per micro-batch"
    return None


def shared_buffers(model) -> dict:
    """{buffer path: every path it is held under} for buffers one module holds for several blocks
    (torchtune's rotary module set as every layer's pos_embeddings)."""
    paths = {}
    for name, buf in model.named_buffers(remove_duplicate=False):
        paths.setdefault(id(buf), []).append(name)
    return {ps[0]: ps for ps in paths.values() if len(ps) > 1}


def check(model, plan, example, graph=None) -> None:
    """Refuse `plan` when it splits the batch of a model whose forward writes a buffer from it, or
    when a pipeline gives each stage its own copy of such a buffer that several blocks share (each
    stage would update its copy from its own blocks' inputs: the copies drift from one process's).
    `graph`: the model's capture when the fingerprint check has one, else captured here."""
    why = splits_batch(plan)
    shared = shared_buffers(model) if plan.parallel["pp"] > 1 else {}
    if why is None and not shared:
        return
    if graph is None:
        from ...capture.batchy import batch_stat_modules
        bn = batch_stat_modules(model)
        if all(q.rpartition(".")[0] in bn for q, _ in model.named_buffers()):
            return                      # no buffer but a batch norm's: nothing to capture for
        from .plan import _captures
        graph = next(_captures(model, example), None)
    names = (graph.meta.get("batch_buffers") or []) if graph is not None else []
    if why is None:
        both = [n for n in names if any(n in ps for ps in shared.values())]
        if both:
            paths = next(ps for ps in shared.values() if both[0] in ps)
            raise PlanError(f"buffer {both[0]!r} is written in forward from the batch by a module {len(paths)} blocks "
                            f"share ({', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''}), and pp="
                            f"{plan.parallel['pp']} gives each stage its own copy, which would drift from one "
                            f"process's; pin pp=1, or give each block its own module")
        return
    if names:
        more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
        raise PlanError(f"buffer {names[0]!r}{more} is written in forward from the batch (an EMA or running "
                        f"statistic) and {why}, so it would not be updated as one process updates it; search "
                        f"again (the search keeps such a model on the whole batch) or pin dp=1, cp=1 and "
                        f"micro_batches=1, or move the update out of forward")
