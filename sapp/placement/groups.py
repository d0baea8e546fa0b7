"""Which parameters of a stage are placement candidates, and what the user pinned.

Host-table candidates are embedding tables with sparse gradients (`ParamInfo.sparse_grad`, i.e.
`nn.Embedding(sparse=True)`) that only embedding lookups use (a table tied to an output head is
dense and stays on the device).  Everything else trainable is "dense": it can only have its optimizer
offloaded.  Pins: {"<fnmatch pattern on param or module qualnames>": "host"|"device",
"optimizer": "host"|"device"}."""
from __future__ import annotations

import fnmatch
import weakref
from dataclasses import dataclass

from ..errors import ConstraintError
from .cost import Table

PLACES = ("host", "device")


@dataclass(frozen=True)
class StageParams:
    tables: tuple          # Table, sorted by name
    dense: dict            # qualname -> numel (trainable, not host-table candidates)
    groups: dict           # group key ("layers.3" block or module) -> numel of its dense params
    all_params: bool       # the stage holds every trainable parameter of the graph


def table_kind(name: str) -> str:
    """Host optimizer of a table: FTRL for the wide (linear) part, lazy Adam otherwise (MindSpore's
    Wide&Deep convention)."""
    return "ftrl" if "wide" in name.split(".")[0] else "sparse_adam"


_FACTS = {}   # id(graph) -> (weakref to graph, used_by, per-node facts, stage memo): the joint search asks per config


def _graph_facts(graph):
    """{param: kinds of the ops using it}, {node: (params, ids per lookup, kind, group)}; cached per
    graph object (graphs are not mutated after capture)."""
    return _facts_entry(graph)[1:3]


def _facts_entry(graph):
    """(weakref, used_by, per_node, stage_params memo) of `graph`."""
    hit = _FACTS.get(id(graph))
    if hit is not None and hit[0]() is graph:
        return hit
    used_by, per_node = {}, {}
    for n in graph.nodes.values():
        ps = [o.param for o in n.operands if o.param is not None]
        ids = max((o.numel for o in n.operands if o.param is None), default=0) if n.kind == "embedding" else 0
        per_node[n.name] = (ps, ids, n.block or n.module)
        for p in ps:
            used_by.setdefault(p, set()).add(n.kind)
    if len(_FACTS) >= 16:
        _FACTS.clear()
    _FACTS[id(graph)] = (weakref.ref(graph), used_by, per_node, {})
    return _FACTS[id(graph)]


def stage_params(graph, node_names, micro_batch_size=None) -> StageParams:
    """The stage's placement candidates; cached per graph, stage and micro-batch size (the joint
    search asks for the same stages over many configurations)."""
    _, used_by, per_node, memo = _facts_entry(graph)
    key = (tuple(node_names), micro_batch_size)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _stage_params(graph, node_names, micro_batch_size, used_by, per_node)
    return hit


def _stage_params(graph, node_names, micro_batch_size, used_by, per_node) -> StageParams:
    scale = 1.0 if not micro_batch_size else micro_batch_size / max(1, graph.batch_size)
    lookups, owner_group = {}, {}
    for name in node_names:
        if name not in per_node:
            continue
        ps, ids, group = per_node[name]
        for p in ps:
            if ids:
                lookups[p] = lookups.get(p, 0) + ids
            owner_group.setdefault(p, group or p.rsplit(".", 1)[0])
    tables, dense, groups = [], {}, {}
    for p in sorted(owner_group):
        info = graph.params.get(p)
        if info is None or not info.trainable:
            continue
        if info.sparse_grad and used_by.get(p) == {"embedding"} and len(info.shape) == 2:
            tables.append(Table(p, int(info.shape[0]), int(info.shape[1]),
                                int(round(lookups.get(p, 0) * scale)), table_kind(p)))
        else:
            dense[p] = info.numel
            groups[owner_group[p]] = groups.get(owner_group[p], 0) + info.numel
    n_trainable = sum(1 for i in graph.params.values() if i.trainable)
    n_mine = sum(1 for p in owner_group if p in graph.params and graph.params[p].trainable)
    return StageParams(tuple(tables), dense, groups, n_mine == n_trainable)


@dataclass(frozen=True)
class Pins:
    tables: dict           # table qualname -> "host" | "device" (only pinned ones)
    optimizer: str | None  # "host" | "device" | None


def parse_pins(pins, graph, stage: StageParams | None) -> Pins:
    """Check pins against the whole graph (a pattern may name another stage's tables) and resolve
    them for this stage's tables (`stage` None: the check alone, which the search runs once before
    pricing any candidate)."""
    if not pins:
        return Pins({}, None)
    if not isinstance(pins, dict):
        raise ConstraintError(f"placement pins must be a mapping like {{'deep_emb.*': 'host', 'optimizer': 'host'}}, "
                              f"got {type(pins).__name__}")
    opt, tables = None, {}
    all_params = sorted(p for p, i in graph.params.items() if i.trainable)
    stage_tables = {t.name for t in stage.tables} if stage is not None else set()
    for pattern in sorted(pins):
        where = pins[pattern]
        if where not in PLACES:
            raise ConstraintError(f"placement pin {pattern!r}: {where!r} is not 'host' or 'device'")
        if pattern == "optimizer":
            opt = where
            continue
        matched = [p for p in all_params if _matches(p, pattern)]
        if not matched:
            raise ConstraintError(f"placement pin {pattern!r} matches no trainable parameter of "
                                  f"{graph.name!r}; e.g. {', '.join(all_params[:4])}")
        if where == "host":
            bad = [p for p in matched if not _host_capable(graph, p)]
            if bad:
                raise ConstraintError(f"placement pin {pattern!r}: {bad[0]} is not a sparse embedding table "
                                      "(nn.Embedding(sparse=True) used only by lookups), so its weights cannot "
                                      "live on the host; pin 'optimizer': 'host' to offload its optimizer instead")
        for p in matched:
            if p in stage_tables:
                if tables.get(p, where) != where:
                    raise ConstraintError(f"placement pins put {p} both on the host and on the device; keep one")
                tables[p] = where
    return Pins(tables, opt)


def _matches(param: str, pattern: str) -> bool:
    """A pin names parameters ("deep_emb.weight", "deep_emb.*") or their modules ("deep_emb")."""
    return fnmatch.fnmatchcase(param, pattern) or ("." in param and fnmatch.fnmatchcase(param.rsplit(".", 1)[0], pattern))


def _host_capable(graph, p) -> bool:
    info = graph.params[p]
    kinds = _graph_facts(graph)[0].get(p, set())
    return bool(info.sparse_grad) and kinds == {"embedding"} and len(info.shape) == 2
