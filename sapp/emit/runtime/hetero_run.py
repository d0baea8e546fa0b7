"""One rank of `sapp run` on a mixed cluster's plan (a plan with `groups`, sapp/plan/mixed.py; uneven data shares).

Every rank emits an ordinary program: its group's plan (zero, recompute, micro-batches, host
placement as that group was searched) laid over the whole job as data parallelism, dp = the world
(`rank_plan`).  Where the groups' ZeRO stages differ every rank runs the highest of them: ZeRO
shards over all ranks, so one stage must run on each, and a higher stage never needs more memory.

After the process group forms, every rank's group name is gathered (`place`): a rank's group comes
from its node's `sapp run` (--group, or the device the node reports; sapp/commands/run_hetero.py),
and torchrun's rendezvous numbers the nodes in the order they join, so the layout is read off the
names, not off rank numbers.  Each group must have exactly its devices' ranks.  Its share of every
global batch is split evenly over its ranks, in the plan's group order and the ranks' order inside a
group: rank i of group g reads rows [start_g + i x share_g / devices_g, ...) of global batch k, so the
batches cover every sample of the stream once a step, as for an ordinary plan (data.Batches.rows).

The gradients are weighted by `hetero_data.loss_scale`: each rank's mean loss times world x rows /
global batch, so the program's mean over all ranks is one process's update on the whole batch, and
its global loss the whole batch's mean loss (sapp/emit/dp/hetero_data.py).

Mode "pipeline" (stages on the groups, sapp/api/mixed_pipe.py): every rank runs the ordinary pp plan
at the document's top, whose ranks are numbered stage by stage (emit/tp/parallel.coords: pp outermost),
so group g's ranks must be the consecutive ranks of its stages.  `place` checks each rank's group
is its stage's (a rank cannot move to another stage: the nodes must join in the groups' order) and
weighs nothing: every stage sees every sample, the dp replicas even shares."""
from __future__ import annotations

import copy

from ...errors import PlanError
from ...plan.mixed import inner as inner_plan, members, mode, pipe
from ..dp.hetero_data import loss_scale, used_groups as _data_groups


def used_groups(doc) -> list:
    """The groups that get ranks, in rank order, each checked to be what the emitter runs."""
    if mode(doc) == "pipeline":
        return pipeline_groups(doc)
    return _data_groups(doc)


def pipeline_groups(doc) -> list:
    """Pipeline mode: every group (each holds stages), refused in one line where the stages are not
    what the emitter runs across groups (tp, cp or ep inside a stage, interleaved chunks)."""
    inner = inner_plan(doc)
    par = inner.get("parallel") or {}
    lay = " ".join(f"{k}={par[k]}" for k in ("tp", "cp", "ep") if int(par.get(k, 1) or 1) != 1)
    if lay:
        raise PlanError(f"the pipeline's stages run {lay}: stages across groups are emitted with dp only; pin tp=1 "
                        "or search the mixed cluster in data mode")
    pipe = inner.get("pipeline") or {}
    if int(pipe.get("virtual_chunks", 1) or 1) != 1 or pipe.get("schedule") not in ("1f1b", "gpipe"):
        raise PlanError(f"the pipeline runs {pipe.get('schedule')} with {pipe.get('virtual_chunks', 1)} chunks: stages "
                        "across groups are emitted for 1f1b or gpipe without interleaving")
    return members(doc)


def load(path):
    """The checked mixed-cluster plan in `path`, or None for an ordinary plan."""
    from ...plan import load_any
    kind, doc = load_any(path)
    return doc if kind == "mixed" else None


def by_position(doc, rank: int) -> str:
    """A rank's group when one node runs every group: ranks laid out group by group, in plan order."""
    start = 0
    for g in used_groups(doc):
        start += g["devices"]
        if rank < start:
            return g["name"]
    raise PlanError(f"rank {rank} is outside the plan's {start} devices; launch {start} processes")


def _stage_groups(doc) -> list:
    """Pipeline mode: the group of every rank, in rank order."""
    w = pipe(doc)["stage_width"]
    return [g["name"] for g in pipeline_groups(doc) for _ in g["stages"] for _ in range(w)]


def zero_stage(doc) -> int:
    return max(int(g["plan"].get("zero", 0) or 0) for g in used_groups(doc))


def rank_plan(doc, group: str, world: int):
    """`group`'s plan laid over the whole job: dp = world, the whole global batch, one ZeRO stage."""
    from ...plan import Plan
    groups = used_groups(doc)
    if mode(doc) == "pipeline":
        if group not in [g["name"] for g in groups]:
            raise PlanError(f"group {group!r} is not one of this plan's groups ({', '.join(g['name'] for g in groups)})")
        if world != doc["devices"]:
            raise PlanError(f"the pipeline runs on the plan's {doc['devices']} devices but this job has {world} "
                            "processes; start every group's nodes")
        return Plan(inner_plan(doc))
    mine = next((g for g in groups if g["name"] == group), None)
    if mine is None:
        raise PlanError(f"group {group!r} has no share in this plan; its groups with a share are "
                        f"{', '.join(g['name'] for g in groups)}")
    precisions = {(g["plan"].get("settings") or {}).get("precision", "fp32") for g in groups}
    if len(precisions) > 1:
        raise PlanError(f"the groups' plans train in different precisions ({', '.join(sorted(precisions))}); "
                        "search the mixed cluster again with one --precision")
    d = copy.deepcopy(mine["plan"])
    d["devices"] = world
    d["parallel"] = dict(d["parallel"], dp=world)
    d["model"] = dict(d["model"], global_batch=doc["model"]["global_batch"])
    # a group's micro-batch size is its own (share / devices / micro-batches): not one over the job
    d["pipeline"] = {k: v for k, v in d["pipeline"].items() if k != "micro_batch_size"}
    d["zero"] = zero_stage(doc)
    d["predicted"] = dict(d["predicted"], step_time_s=doc["predicted"]["step_time_s"])
    return Plan(d)


def place(doc, group: str, rank: int, world: int) -> dict:
    """{"rows": (lo, hi) of each global batch, "scale": the loss factor, "note": the layout}, from
    every rank's group name (one all_gather_object)."""
    import torch.distributed as dist
    names = [group]
    if world > 1:
        names = [None] * world
        dist.all_gather_object(names, group)
    if mode(doc) == "pipeline":
        return _place_stages(doc, names, rank)
    groups = used_groups(doc)
    want = {g["name"]: g["devices"] for g in groups}
    have = {n: names.count(n) for n in dict.fromkeys(names)}
    if have != want:
        e = PlanError(f"the plan's groups need {', '.join(f'{n}: {d}' for n, d in want.items())} processes but "
                      f"this job has {', '.join(f'{n}: {c}' for n, c in have.items())}; start each group's nodes "
                      "with its name (--group NAME) and the group's processes per node (--nproc)")
        e.every_rank = True       # every rank sees the same names: rank 0 says it once
        raise e
    gb, start, rows, parts = doc["model"]["global_batch"], 0, None, []
    for g in groups:
        members = [r for r, n in enumerate(names) if n == g["name"]]
        per = g["batch_share"] // g["devices"]
        if rank in members:
            lo = start + members.index(rank) * per
            rows = (lo, lo + per)
        parts.append(f"group {g['name']} rank{'s' if len(members) > 1 else ''} {_span(members)} ({per} samples each)")
        start += g["batch_share"]
    zeros = {int(g["plan"].get("zero", 0) or 0) for g in groups}
    note = (f"mixed-cluster plan: {', '.join(parts)} of global batch {gb}; each rank's loss weighted by "
            f"{world} x its samples / {gb}")
    if len(zeros) > 1:
        note += f"; ZeRO-{max(zeros)} on every rank (the groups' plans have {', '.join(map(str, sorted(zeros)))})"
    return {"rows": rows, "scale": loss_scale(rows[1] - rows[0], world, gb), "note": note}


def _place_stages(doc, names, rank):
    """Pipeline mode: every rank's group must be its stage's; nothing to weigh (None)."""
    want = _stage_groups(doc)
    if names != want:
        bad = next(r for r, (a, b) in enumerate(zip(names, want)) if a != b) if len(names) == len(want) else 0
        e = PlanError(f"the pipeline's ranks run stages in group order ({', '.join(g['name'] for g in members(doc))}) "
                      f"but rank {bad} is in group {names[bad] if bad < len(names) else '?'}, not {want[bad]}: start the "
                      "groups' nodes in that order (--node-rank) with their group's processes")
        e.every_rank = True
        raise e
    return None


def _span(ranks) -> str:
    return (f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1))
            else ",".join(map(str, ranks)))


def weigh(prog, share: dict) -> None:
    """This rank's mean loss times its factor (the program's mean over ranks becomes the weighted sum)."""
    base, scale = prog.loss_fn, share["scale"]
    prog.loss_fn = lambda out, target: base(out, target) * scale
    prog.notes.append(share["note"])
