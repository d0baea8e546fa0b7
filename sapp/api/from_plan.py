"""A plan read back as the search's pins: its configuration, its splits, its stages and placement, so
re-scoring it (sapp.evaluate) is a search with exactly one configuration left."""
from __future__ import annotations

from sapp.errors import PlanError
from sapp.pipeline.dualpipe import rank_of
from sapp.plan import Plan
from sapp.search.constraints import Constraints


def _device(pipe, pp, st) -> int:
    """The pipeline rank a plan's stage entry runs on: its device_stage, else the schedule's placement
    (index mod pp; DualPipeV's V)."""
    return st.get("device_stage", rank_of(pipe.get("schedule"), pp, st["index"]))


def _interleaved_rename(pipe, pp, v):
    """{real block -> block at the same position of the contiguous layout the joint search prices}.
    An interleaved plan gives device i the chunks c * pp + i; the search prices device i as the
    contiguous run of L / pp blocks and renames them afterwards (sapp/search/joint/evaluate.py: _interleave_blocks), so a
    per-block pin read back from the plan must be moved to the block it was priced as.  (DualPipeV: chunks
    i and 2 pp - 1 - i.  Blocks of several types are priced over each device's real blocks instead, and
    search/joint/single._real_pins moves such pins back.)"""
    st = sorted(pipe.get("stages") or [], key=lambda s: s["index"])
    flat = [b for s in st for b in s.get("blocks") or []]
    if not flat:
        return {}
    out, pos = {}, 0
    for i in range(pp):
        # device i was priced as the next contiguous run of as many blocks as its chunks hold
        real = [b for s in st if _device(pipe, pp, s) == i for b in s.get("blocks") or []]
        out.update({b: flat[pos + q] for q, b in enumerate(real)})
        pos += len(real)
    return out


def _blocks_from_split_points(stages, graph):
    """The stages with their blocks read off `split_before` when none lists any (a hand-written plan
    may name split points only): `sapp run` splits the model there, so re-scoring must price that
    split, not the one the search would choose.  Unchanged when blocks are listed, when there is no
    graph, or when a split point names no module of the graph (the emitter's check says so)."""
    if not stages or graph is None or any(s.get("blocks") for s in stages):
        return stages
    first = {}                      # module -> position of its first op, in forward order
    for i, n in enumerate(graph.nodes.values()):
        mod = n.module or ""
        while mod and mod not in first:
            first[mod] = i
            mod = mod.rpartition(".")[0]
    st = sorted(stages, key=lambda s: s.get("index", 0))
    at = [first.get(s.get("split_before")) for s in st[:-1]]
    if None in at or not graph.blocks:
        return stages
    out, where = [dict(s, blocks=[]) for s in st], {name: i for i, name in enumerate(graph.nodes)}
    for b, nodes in graph.blocks.items():
        pos = where.get(nodes[0]) if nodes else None
        if pos is None:
            return stages
        out[sum(1 for a in at if a <= pos)]["blocks"].append(b)
    return out


def constraints_from_plan(plan: Plan, graph=None) -> Constraints:
    """The plan's choices as pins: re-scoring it is a search with exactly one configuration left."""
    par, pipe = plan["parallel"], plan["pipeline"]
    sched = pipe.get("schedule", "none")
    v = pipe.get("virtual_chunks") or 1
    stages = None
    st = _blocks_from_split_points(pipe.get("stages") or [], graph)
    chunked = sched in ("interleaved", "dualpipev")     # several stages a device
    if par["pp"] > 1 and st and not chunked:
        stages = {s["blocks"][0]: s.get("index", 0) for s in st if s.get("blocks")}
    rc = plan["recompute"] or {}
    recompute = dict(rc.get("blocks") or {})
    if chunked and recompute:
        rename = _interleaved_rename(pipe, par["pp"], v)
        recompute = {rename.get(b, b): pol for b, pol in recompute.items()}
    if par["pp"] > 1 and st and chunked:
        # the devices' block counts (they may differ), pinned on the contiguous layout priced
        flat = [b for s in sorted(st, key=lambda s: s["index"]) for b in s.get("blocks") or []]
        counts = [sum(len(s.get("blocks") or []) for s in st if _device(pipe, par["pp"], s) == i)
                  for i in range(par["pp"])]
        if flat and all(counts):
            stages, pos = {}, 0
            for i, k in enumerate(counts):
                stages[flat[pos]] = i
                pos += k
    recompute["default"] = rc.get("default", "none")
    return Constraints(tp=par["tp"], dp=par["dp"], pp=par["pp"], ep=par.get("ep", 1), micro_batches=pipe["micro_batches"],
                       schedule=sched if par["pp"] > 1 else None,
                       virtual_chunks=v if sched == "interleaved" else 2 if sched == "dualpipev" else None,
                       recompute=recompute, zero=plan["zero"], stages=stages, sp=bool(par.get("sp", False)),
                       placement=_placement_pins(plan, graph) if graph is not None else None,
                       cp=par.get("cp", 1), dp_replicate=par.get("dp_replicate"),
                       target=_hsdp_target(plan) or ("megatron" if par.get("etp") else None),
                       etp=par.get("etp", 0) if par.get("ep", 1) > 1 and par["tp"] > 1 else None)


def _placement_pins(plan, graph):
    """The plan's host placement as pins, so re-scoring prices the placement the plan chose (evaluate
    ignores capacity, so an unpinned placement would fall back to the fastest, usually all-device).
    Host-capable tables the plan leaves on the device are pinned there; the dense optimizer is
    pinned to where the plan's non-table entries keep it.  A plan whose stages offload differently
    cannot be said with global pins: the optimizer is then left to the evaluator."""
    from sapp.placement.groups import _host_capable
    from sapp.placement.schema import resolve
    section = plan._d.get("placement") or {}
    pins, offload = {}, set()
    for name, info in sorted(graph.params.items()):
        if not info.trainable:
            continue
        entry = resolve(section, name) or {}
        if _host_capable(graph, name):
            pins[name] = "host" if entry.get("weights") == "host" else "device"
        else:
            offload.add(entry.get("optimizer") == "host")
    if len(offload) == 1:
        pins["optimizer"] = "host" if offload.pop() else "device"
    return pins or None


def _plan_splits(plan, graph):
    """Per-node split tuples from the plan; every entry must be null or one of the node's op dims."""
    from sapp.search import tp_layout
    ops = plan["operators"]
    out = {}
    for name, node in graph.nodes.items():
        op = ops.get(name)
        if op is None:
            continue
        split = op.get("split") or ()
        dims = {d.name: d for d in node.dims}
        for d in split:
            if d is not None and d not in dims:
                raise PlanError(f"operators.{name}.split names dim {d!r}, which operator {name} does not have "
                                f"(its dims: {', '.join(dims) or 'none'}); use one of them or null")
            # a fused projection's piece runs split by heads along its cut (search/tp_layout.py)
            if d is not None and not dims[d].splittable and tp_layout.piece_cut(node, d) is None:
                raise PlanError(f"operators.{name}.split splits dim {d!r}, which cannot be split; use null")
        out[name] = tuple(split)
    return out


def _plan_config(plan, gb):
    from sapp.search.joint import Config
    par, pipe = plan["parallel"], plan["pipeline"]
    sched = pipe.get("schedule", "none") if par["pp"] > 1 else "none"
    m = pipe["micro_batches"]
    per_rep = gb // par["dp"]
    return Config(par["pp"], par["dp"], par["tp"], m, per_rep // m, sched,
                  (pipe.get("virtual_chunks") or 1) if sched == "interleaved" else 2 if sched == "dualpipev" else 1,
                  plan["zero"],
                  cp=par.get("cp", 1), ep=par.get("ep", 1), sp=bool(par.get("sp", False)),
                  rep=par.get("dp_replicate", 1), etp=par.get("etp", 0))


def _hsdp_target(plan):
    """The torchtitan target an HSDP plan is re-scored under (only those run it), else None."""
    if plan["parallel"].get("dp_replicate", 1) <= 1:
        return None
    from sapp.search.targets import ENGINES
    runtime = (plan._d.get("settings") or {}).get("runtime")
    # the release whose profiles price the plan (torchtitan@0.2.2's include its +compile and 2412 stacks)
    return "torchtitan@0.2.2" if runtime in ENGINES["torchtitan@0.2.2"].runtimes else "torchtitan"
