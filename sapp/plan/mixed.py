"""A mixed cluster's plan: an ordinary plan document (sapp.plan/1) with a `groups` section.

A plan of one device kind is one group and has no section.  `groups.mode` says how the groups share
the step:
  - "data": each group a data-parallel replica with its own share of the global batch, each member
    carrying its own ordinary plan (`plan`, at global_batch = its `batch_share`, on its devices); the
    document's top holds what is common (model, the mixed cluster, devices, predicted step, notes);
  - "pipeline": one pipeline whose stages sit on the groups.  The document's top IS the ordinary pp
    plan every rank runs (parallel, pipeline, operators, ...), with the mixed cluster as `cluster`;
    each member lists its stages (blocks, units, per-micro-batch times on its devices, link sends), and
    `groups.stage_cluster` is the one-kind cluster the ordinary fields are stated on (every device as
    the slowest kind; each stage is still priced on its own group).
`groups.baselines` are the steps the split has to beat (each group alone, all devices as the slowest
kind, and in pipeline mode the data mode's).  Plans written as `sapp.hetero-plan/1` (this layout's
predecessor: the same fields, with the pipeline's plan nested under `plan`) are migrated on read
(`migrate`).

The accessors below are how every reader gets at a mixed plan (a dict or a Plan): `mode`, `members`,
`baselines`, `pipe` (the pipeline's shape), `group_plan` (the ordinary plan a member's ranks run).
`check` is what the schema cannot say: the data mode's shares add up to the global batch; the pipeline
mode's members hold the stages 0..P-1 in order, as wide as the pipeline, the same blocks as the plan's."""
from __future__ import annotations

from sapp.errors import PlanError

SCHEMA = "sapp.plan/1"
LEGACY = "sapp.hetero-plan/1"
# what the pipeline mode's top-level `predicted` adds to the pp plan's own
CROSS_KEYS = ("cross_group_sync_s", "cross_group_send_s")


def is_mixed(doc) -> bool:
    return "groups" in doc


def mode(doc) -> str:
    return doc["groups"]["mode"]


def members(doc) -> list:
    return list(doc["groups"]["members"])


def baselines(doc) -> dict:
    return doc["groups"]["baselines"]


def pipe(doc) -> dict:
    """The pipeline's shape, read off the pp plan at the document's top: stages, stage_width (its dp),
    micro_batches, micro_batch_size, schedule, zero."""
    par, p = doc["parallel"], doc["pipeline"]
    return {"stages": par["pp"], "stage_width": par["dp"], "micro_batches": p["micro_batches"],
            "micro_batch_size": p.get("micro_batch_size"), "schedule": p.get("schedule"), "zero": doc["zero"]}


def inner(doc) -> dict:
    """Pipeline mode: the ordinary pp plan every rank runs, as its own document (a fresh dict): the
    top of `doc` without `groups`, on `groups.stage_cluster`, its prediction without the cross-group
    figures."""
    d = doc.to_dict() if hasattr(doc, "to_dict") else doc
    out = {k: _copy(v) for k, v in d.items() if k != "groups"}
    out["cluster"] = _copy(doc["groups"]["stage_cluster"])
    out["predicted"] = {k: v for k, v in doc["predicted"].items() if k not in CROSS_KEYS}
    return out


def _copy(x):
    import copy
    return copy.deepcopy(x)


def used_groups(doc) -> list:
    """The groups that train: in data mode those with a share (each holds its own plan), in pipeline
    mode every group (each holds stages of the one plan)."""
    if mode(doc) == "pipeline":
        return members(doc)
    return [g for g in members(doc) if g.get("batch_share")]


def group_plan(doc, g) -> dict:
    """The ordinary plan group `g` (a member) runs for its part: its own plan in data mode (at its
    share of the batch, on its devices), the pipeline's one plan in pipeline mode."""
    return inner(doc) if mode(doc) == "pipeline" else g["plan"]


def check(doc):
    """What the schema cannot say of a mixed plan (the schema has run: Plan._validate)."""
    if mode(doc) == "pipeline":
        return check_pipeline(doc)
    if sum(g["batch_share"] for g in members(doc)) != doc["model"]["global_batch"]:
        raise PlanError("mixed-cluster plan: the groups' batch shares do not add up to model.global_batch")
    return doc


def check_pipeline(doc):
    """The members' stages are 0..P-1 in order, consecutive per group, each group as wide as its stages,
    the plan's own stages the same blocks."""
    p = pipe(doc)
    idx = [s["index"] for g in members(doc) for s in g["stages"]]
    if idx != list(range(p["stages"])):
        raise PlanError(f"mixed-cluster plan: the groups' stages are {idx[:16]}, not 0..{p['stages'] - 1} in group "
                        "order; search the plan again")
    for g in members(doc):
        if g["devices"] != len(g["stages"]) * p["stage_width"]:
            raise PlanError(f"mixed-cluster plan: group {g['name']} has {g['devices']} devices for {len(g['stages'])} "
                            f"stages of {p['stage_width']}; search the plan again")
    stages = sorted(doc["pipeline"].get("stages") or [], key=lambda s: s.get("index", 0))
    if [list(s.get("blocks") or []) for s in stages] != [s["blocks"] for g in members(doc) for s in g["stages"]]:
        raise PlanError("mixed-cluster plan: the pipeline's stages are not the groups' stages; search the plan again")
    if sum(g["devices"] for g in members(doc)) != doc["devices"]:
        raise PlanError("mixed-cluster plan: the groups' devices do not add up to devices; search the plan again")
    return doc


def data_document(model, cluster, devices, members_, predicted, baselines_, notes) -> dict:
    """A data-mode mixed plan from its parts (sapp/api/mixed.py)."""
    return {"schema": SCHEMA, "model": model, "cluster": cluster, "devices": devices, "predicted": predicted,
            "groups": {"mode": "data", "members": members_, "baselines": baselines_}, "notes": notes}


def pipeline_document(plan, cluster, members_, cross, baselines_, notes) -> dict:
    """A pipeline-mode mixed plan: the pp plan's document `plan` (a dict) on the mixed `cluster`, its
    members' stages, the cross-group figures `cross` (CROSS_KEYS) added to its prediction."""
    doc = dict(plan)
    doc["groups"] = {"mode": "pipeline", "members": members_, "baselines": baselines_,
                     "stage_cluster": plan["cluster"]}
    doc["cluster"] = cluster
    doc["predicted"] = dict(plan["predicted"], **cross)
    doc["notes"] = list(plan.get("notes") or []) + list(notes)
    return doc


def migrate(old) -> dict:
    """A `sapp.hetero-plan/1` document as this layout (the same fields, moved; nothing re-priced).
    Refused in one line where the old document is not one (its shape is checked by the plan schema
    after the move)."""
    try:
        kind = old["mode"]
        if kind == "pipeline":
            plan = old["plan"]
            pr = old["predicted"]
            cross = {k: pr[k] for k in CROSS_KEYS if k in pr}
            doc = pipeline_document(plan, old["cluster"], old["groups"], cross, old["baselines"],
                                    old.get("notes") or [])
            doc["model"] = dict(old["model"], **{k: v for k, v in plan["model"].items() if k not in old["model"]})
            shape, want = pipe(doc), old["pipeline"]
            if any(shape[k] != want[k] for k in want if k in shape):
                raise PlanError(f"{LEGACY} plan: its `pipeline` section {want} is not its plan's; search the plan again")
            return doc
        if kind == "data":
            return data_document(old["model"], old["cluster"], old["devices"], old["groups"], old["predicted"],
                                 old["baselines"], old.get("notes") or [])
    except (KeyError, TypeError, AttributeError) as e:
        raise PlanError(f"{LEGACY} plan is missing {str(e)[:60]} (or it is not an object there); search the plan "
                        "again with this sapp") from None
    raise PlanError(f"{LEGACY} plan has mode {str(kind)[:40]!r}, not data or pipeline; search the plan again")


def describe(doc) -> str:
    """One line of what the mixed plan is: its mode and each group's part."""
    gb = doc["model"]["global_batch"]
    if mode(doc) == "pipeline":
        p = pipe(doc)
        return (f"pipeline of {p['stages']} stages x {p['stage_width']} over " + ", ".join(
            f"{g['name']} ({len(g['stages'])} stage{'s' if len(g['stages']) > 1 else ''})" for g in members(doc)))
    return "data-parallel groups: " + ", ".join(
        f"{g['name']} {g['batch_share']}/{gb}" + (" " + _layout(g["parallel"]) if g.get("batch_share") else " unused")
        for g in members(doc))


def _layout(par) -> str:
    return " ".join(f"{k}{par[k]}" for k in ("dp", "tp", "pp", "cp", "ep") if k in ("dp", "tp", "pp") or par.get(k, 1) > 1)


def cluster_spec(doc) -> str:
    """The plan's cluster as a `--cluster` spec, each group by its name and nodes (the spec that wrote it
    where the groups are named after their presets, as a spec's groups are)."""
    return "+".join(f"{g['name']}:nodes={g.get('nodes', 1)}" for g in doc["cluster"]["groups"])


def search_command(doc, mode=None) -> str:
    """The `sapp search` that prices this plan's model, batch and cluster again."""
    return (f"sapp search --model {doc['model']['name']} --cluster {cluster_spec(doc)} --batch "
            f"{doc['model']['global_batch']}" + (f" --mixed-mode {mode}" if mode else ""))
