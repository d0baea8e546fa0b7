"""The checks of a mixed-cluster plan document (sapp.hetero-plan/1), apart from the search that writes
it (sapp/api/mixed.py), so that the one loader every command uses (sapp.plan.load_any) can check
both kinds of plan without importing the search: the schema (sapp/schema/hetero.schema.json), then
what it cannot say: the data mode's shares add up to the global batch; the pipeline mode's groups
hold the stages 0..P-1 in order, as wide as the pipeline, and its inner plan's stages are theirs."""
from __future__ import annotations

from sapp import schema as _schema
from sapp.errors import PlanError
from sapp.search.hetero import SCHEMA  # noqa: F401 - this module's name for the document's schema


def check(doc) -> dict:
    if not isinstance(doc, dict):
        raise PlanError("a mixed-cluster plan must be a JSON object")
    err = _schema.document_problem("hetero", doc)
    if err:
        raise PlanError(f"mixed-cluster plan: {err}")
    if doc["mode"] == "pipeline":
        return check_pipeline(doc)
    if sum(g["batch_share"] for g in doc["groups"]) != doc["model"]["global_batch"]:
        raise PlanError("mixed-cluster plan: the groups' batch shares do not add up to model.global_batch")
    return doc


def check_pipeline(doc) -> dict:
    """What the schema cannot say of the pipeline mode: the groups' stages are 0..P-1 in order,
    consecutive per group, the inner plan's stages the same blocks."""
    pipe = doc["pipeline"]
    idx = [s["index"] for g in doc["groups"] for s in g["stages"]]
    if idx != list(range(pipe["stages"])):
        raise PlanError(f"mixed-cluster plan: the groups' stages are {idx}, not 0..{pipe['stages'] - 1} in group "
                        "order; search the plan again")
    for g in doc["groups"]:
        if g["devices"] != len(g["stages"]) * pipe["stage_width"]:
            raise PlanError(f"mixed-cluster plan: group {g['name']} has {g['devices']} devices for {len(g['stages'])} "
                            f"stages of {pipe['stage_width']}; search the plan again")
    inner = (doc["plan"].get("pipeline") or {}).get("stages") or []
    outer = [s["blocks"] for g in doc["groups"] for s in g["stages"]]
    if [list(s.get("blocks") or []) for s in sorted(inner, key=lambda s: s.get("index", 0))] != outer:
        raise PlanError("mixed-cluster plan: `plan`'s pipeline stages are not the groups' stages; search the plan again")
    par = doc["plan"].get("parallel") or {}
    if par.get("pp") != pipe["stages"] or par.get("dp") != pipe["stage_width"] or doc["plan"].get("devices") != doc["devices"]:
        raise PlanError("mixed-cluster plan: `plan`'s pp, dp or devices are not the pipeline's; search the plan again")
    return doc


def used_groups(doc) -> list:
    """The groups that train: in data mode those with a share (each holds its own plan), in pipeline
    mode every group (each holds stages of the one inner plan)."""
    if doc["mode"] == "pipeline":
        return list(doc["groups"])
    return [g for g in doc["groups"] if g.get("batch_share")]


def group_plan(doc, g) -> dict:
    """The ordinary plan group `g` (an entry of doc["groups"]) runs for its part: its own plan in data
    mode (at its share of the batch, on its devices), the pipeline's one plan in pipeline mode."""
    return doc["plan"] if doc["mode"] == "pipeline" else g["plan"]


def describe(doc) -> str:
    """One line of what the mixed plan is: its mode and each group's part."""
    gb = doc["model"]["global_batch"]
    if doc["mode"] == "pipeline":
        p = doc["pipeline"]
        return (f"pipeline of {p['stages']} stages x {p['stage_width']} over " + ", ".join(
            f"{g['name']} ({len(g['stages'])} stage{'s' if len(g['stages']) > 1 else ''})" for g in doc["groups"]))
    return "data-parallel groups: " + ", ".join(
        f"{g['name']} {g['batch_share']}/{gb}" + (" " + _layout(g["parallel"]) if g.get("batch_share") else " unused")
        for g in doc["groups"])


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
