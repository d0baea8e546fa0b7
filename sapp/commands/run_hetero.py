"""`sapp run MIXED_PLAN.json`: which group of a mixed-cluster plan (a plan with `groups`) this node runs,
checked before anything is launched.

A group's device kind is read from its name, else from its notes: the first of cpu, v100, a100, h100,
h200, ... found there (spec groups are named after their preset: `a100-80g`, `cpu-2`).  A node's kind
is read the same way from the device it reports: torch's CUDA device name ("NVIDIA A100-SXM4-80GB"),
or "cpu" without CUDA.

  one node (no --nnodes)   the node runs every group with a share, ranks group by group in plan order;
                           each group's kind must be the node's
  --nnodes N, --group NAME this node runs group NAME; refused when the group's kind is not the
                           node's, or (CUDA) when its devices have less memory than the group was
                           planned with (below 90%: the plan's memory would not fit)
  --nnodes N               the group whose kind is the node's; refused when none or several are
                           (then --group says which)

A group whose kind sapp cannot tell (a cluster file's group named neither after its devices nor with
them in its notes) runs where it is named (--group, or a one-node job) with a note: nothing to check
it against.  There is no flag that overrides a refusal: a node trains the share its group was planned
for, and a device of another kind would set the pace of the whole step or run out of memory.

Processes per node: the group's gpus_per_node in the plan's cluster (--nproc overrides it for this
node's group; a one-node job runs all the groups' devices).  --nnodes must be the plan's node count,
every group's devices / its processes per node.  The ranks check the layout again once the job has
formed (sapp/emit/runtime/hetero_run.py): each group must have exactly its devices' processes.  A
pipeline-mode plan (stages on the groups) runs one pp plan on every rank; its groups are listed in
stage order and their ranks must come in that order (a one-node job lays them out so; on several
nodes the ranks refuse, before the first step, a job whose nodes joined in another order)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import PlanError, UsageError

_KIND = re.compile(r"(?<![a-z0-9])(cpu|v100|a100|a800|a10|a30|a40|l4|l40|h100|h800|h200|gh200|b100|b200|gb200|"
                   r"mi210|mi250|mi300)(?![0-9])")


@dataclass(frozen=True)
class Node:
    device: str          # what the node reports: "cpu" or the CUDA device name
    memory: float = None  # bytes per device (CUDA), None on CPU

    @property
    def kind(self):
        return kind_of(self.device)


def kind_of(text):
    m = _KIND.search(str(text or "").lower())
    return m.group(1) if m else None


def group_kind(spec: dict):
    """The device kind a group was described for: from its name, else its notes; None if neither says."""
    return kind_of(spec.get("name")) or kind_of(spec.get("notes"))


def this_node() -> Node:
    import torch
    if not torch.cuda.is_available():
        return Node("cpu")
    props = torch.cuda.get_device_properties(0)
    return Node(props.name, float(props.total_memory))


def mixed_plan(args, nodes: int, single: bool, node: Node = None, loaded=None):
    """(the Plan this node's ranks run, processes per node) for a mixed-cluster plan, else None.
    Sets args.hetero_group (this node's group; None: a one-node job of every group).  `loaded`:
    load_any's (kind, document) of args.plan when the caller has read it already."""
    from ..plan import load_any
    kind, doc = loaded or load_any(args.plan)
    if kind != "mixed":             # (before the emitter's modules, which import torch)
        return None
    from ..emit.runtime import hetero_run
    if getattr(args, "elastic", False):
        raise UsageError("--elastic re-plans for one device kind; a mixed-cluster plan runs on its groups' nodes "
                         "as planned: drop --elastic")
    if ":" in str(args.nnodes or ""):
        raise UsageError(f"--nnodes {args.nnodes}: a mixed-cluster plan runs on a fixed number of nodes; give "
                         f"--nnodes {plan_nodes(doc, None, None)[0]}")
    mine, nproc = choose(doc, node or this_node(), getattr(args, "group", None), single, args.nproc)
    if not single:
        want, how = plan_nodes(doc, mine, nproc)
        if nodes != want:
            raise UsageError(f"the plan's groups run on {want} nodes ({how}) but --nnodes is {nodes}; give "
                             f"--nnodes {want} and start one `sapp run` on each")
    args.hetero_group = None if single else mine
    world = sum(g["devices"] for g in hetero_run.used_groups(doc))
    return hetero_run.rank_plan(doc, mine or hetero_run.by_position(doc, 0), world), nproc


def choose(doc, node: Node, group, single: bool, nproc):
    """(this node's group name, or None for every group in a one-node job; processes on this node)."""
    from ..emit.runtime import hetero_run
    used = hetero_run.used_groups(doc)            # refuses layouts the emitter cannot split
    specs = {g["name"]: g for g in doc["cluster"]["groups"]}
    names = [g["name"] for g in used]
    lost = [n for n in names if n not in specs]
    if lost:
        raise PlanError(f"mixed-cluster plan: group {lost[0]} is not one of its cluster's groups "
                        f"({', '.join(specs)}); search the plan again")
    if group is not None:
        if group not in specs:
            raise UsageError(f"--group {group!r} is not a group of this plan; its groups are {', '.join(specs)}")
        if group not in names:
            raise UsageError(f"--group {group}: the plan gives that group no share of the batch (it would slow the "
                             f"step); start nodes only for {', '.join(names)}")
        if single and len(names) > 1:
            raise UsageError(f"a one-node job runs every group of the plan ({', '.join(names)}); drop --group, or start "
                             f"one `sapp run --nnodes N --group NAME` on each node of each group")
        _match(group, specs, node, names)
        mine = group
    elif single:
        for name in names:
            _match(name, specs, node, names, every=True)
        mine = None
    else:
        mine = _by_kind(node, specs, names)
    devices = sum(g["devices"] for g in used) if mine is None else next(g["devices"] for g in used if g["name"] == mine)
    if mine is None:
        if nproc is not None and nproc != devices:
            raise UsageError(f"a one-node job of this plan runs all its groups' {devices} devices; give --nproc {devices} "
                             "or start one `sapp run --nnodes N --group NAME` per node")
        return None, devices
    per = nproc or int(specs[mine].get("gpus_per_node") or 1)
    if devices % per:
        raise UsageError(f"group {mine} has {devices} devices, which {per} processes per node do not divide; give "
                         f"--nproc {specs[mine].get('gpus_per_node') or 1} (the group's devices per node)")
    return mine, per


def plan_nodes(doc, mine, nproc) -> tuple:
    """(nodes the plan runs on, 'group: N nodes of P' for each group with a share)."""
    from ..emit.runtime import hetero_run
    specs = {g["name"]: g for g in doc["cluster"]["groups"]}
    total, how = 0, []
    for g in hetero_run.used_groups(doc):
        per = nproc if g["name"] == mine and nproc else int((specs.get(g["name"]) or {}).get("gpus_per_node") or 1)
        n = -(-g["devices"] // per)
        total += n
        how.append(f"{g['name']}: {n} node{'s' if n > 1 else ''} of {per}")
    return total, ", ".join(how)


def _match(name, specs: dict, node: Node, names: list, every=False):
    """Refuse `node` for group `name` when its device kind (or memory) is not the group's."""
    spec = specs[name]
    want = group_kind(spec)
    if want is None:
        print(f"sapp run: note: group {name}'s device kind is not in its name or notes; not checked against this "
              f"node's {node.device}", flush=True)
        return
    if node.kind != want:
        fits = [n for n in names if node.kind and group_kind(specs[n]) == node.kind]
        if every:
            raise PlanError(f"this one-node job runs every group of the plan, but group {name} is planned for {want} "
                            f"devices and this node has {node.device}: run group {name} on {want} nodes"
                            + (", one `sapp run --nnodes N` on each node of each group" if len(names) > 1 else ""))
        mine = (f" and start this node with --group {fits[0]}, the group planned for its devices" if fits else
                "; no group of the plan is planned for this node's devices")
        raise PlanError(f"group {name} is planned for {want} devices but this node has {node.device}: run group "
                        f"{name} on {want} nodes{mine}")
    planned = float(spec.get("device_memory") or 0)
    if node.memory is not None and node.memory < 0.9 * planned:
        raise PlanError(f"group {name} is planned with {planned / 1e9:.3g} GB devices but this node's {node.device} "
                        f"has {node.memory / 1e9:.3g} GB; run group {name} on nodes of the devices it was planned for, "
                        "or describe the group as it is and search again")


def _by_kind(node: Node, specs: dict, names: list) -> str:
    kinds = {n: group_kind(specs[n]) for n in names}
    fits = [n for n in names if kinds[n] is not None and kinds[n] == node.kind]
    if len(fits) == 1:
        return fits[0]
    listed = ", ".join(f"{n} for {kinds[n] or 'devices its description does not name'}" for n in names)
    if fits:
        raise UsageError(f"this node's {node.device} devices fit groups {', '.join(fits)}; say which this node runs "
                         f"with --group NAME")
    unknown = [n for n in names if kinds[n] is None]
    raise PlanError(f"this node has {node.device} and no group of the plan is planned for "
                    f"{node.kind or 'that device'} (the groups: {listed}); start this command on a node of a group's kind"
                    + (f", or with --group {unknown[0]} if it is one of that group's" if unknown else ""))
