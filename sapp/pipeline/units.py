"""A model's units -- its blocks and the glue around them -- and the template graph the sharding search
runs on (one representative block per group of identical ones); `Unit` carries a unit's per-micro-batch
numbers (sapp/pipeline/profile.py fills them)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Unit:
    name: str                  # block qualname or "prologue" / "epilogue" / "glue.<i>"
    kind: str                  # "block" | "glue"
    rep: str                   # representative (type) key: identical units share it
    nodes: list                # node names of this unit in the full graph
    cut_before: bool           # a stage may start at this unit
    fwd: tuple = (0.0, 0.0)    # seconds per micro-batch: c0 + c1 * b (per zero stage, see below)
    bwd: tuple = (0.0, 0.0)
    act: tuple = ((0.0, 0.0),) * 3      # (none, selective, full): affine bytes per micro-batch
    extra: tuple = ((0.0, 0.0),) * 3    # recompute seconds added per micro-batch
    out_bytes: tuple = (0.0, 0.0)       # activation sent to the next unit (per device, per micro-batch)
    side: tuple = ((0.0, 0.0),) * 3     # other tensors a cut after it sends: fwd float/other, bwd (boundary.py)
    out_crosses: bool = True            # a cut after it sends its output (not when position-only / unread)
    zfwd: dict = field(default_factory=dict)    # zero -> (c0, c1) forward incl. ZeRO-3 gathers
    zbwd: dict = field(default_factory=dict)
    grad_sync: dict = field(default_factory=dict)  # zero -> seconds per step (exposed), bandwidth part
    sync_lat: dict = field(default_factory=dict)   # zero -> latency part (paid once per stage)
    zcopy: dict = field(default_factory=dict)      # zero -> FSDP2's exposed copies: (fwd, bwd) s in zfwd/zbwd, s a step
    states: dict = field(default_factory=dict)     # zero -> {"params","grads","optimizer"} bytes
    flops: float = 0.0         # model FLOPs (fwd) of the unit at the captured batch, per sample
    reshard: tuple = (0.0, 0.0)  # tensor-parallel resharding (fwd + bwd) inside fwd/bwd, per micro-batch
    tensors: int = 0           # trainable parameter tensors the unit accounts for (optimizer dispatch)
    fsdp_exempt: float = 0.0   # weight bytes FSDP never gathers (sparse tables, emit.sparse)
    bwd_live: tuple = (0.0, 0.0)  # bytes beyond its stash alive at its backward, affine per micro-batch
    #                               (a loss's gradients under the torchtitan profile, costmodel.torchtitan)

    def reshard_at(self, b):
        return _pw(self.reshard, b)

    def fb_at(self, b, zero):
        """(fwd_s, bwd_s) at micro-batch size b: the first two of `at`."""
        return _pw(self.zfwd.get(zero, self.fwd), b), _pw(self.zbwd.get(zero, self.bwd), b)

    def at(self, b, zero):
        """(fwd_s, bwd_s, act(3), extra(3), out_bytes) at micro-batch size b."""
        f = self.zfwd.get(zero, self.fwd)
        g = self.zbwd.get(zero, self.bwd)
        return (_pw(f, b), _pw(g, b), tuple(a[0] + a[1] * b for a in self.act),
                tuple(_pw(e, b) for e in self.extra), self.out_bytes[0] + self.out_bytes[1] * b)


def _pw(f, b):
    """Value at b of an affine (c0, c1) or of a convex piecewise-linear ((c0, c1), ...) function."""
    if f and isinstance(f[0], tuple):
        return max([c0 + c1 * b for c0, c1 in f])      # (a list: faster than a generator, the same max)
    return f[0] + f[1] * b


def split_units(graph):
    """Units in model order.  Blocks are cut points; glue before the first block is the prologue,
    after the last the epilogue, glue in between gets its own unit (no cut before it).  A graph
    without blocks is cut at every key operator."""
    units = []
    if graph.blocks:
        block_of = {}
        for b, names in graph.blocks.items():
            for n in names:
                block_of[n] = b
        rep = {}
        for grp in graph.block_groups:
            for b in grp:
                rep[b] = grp[0]
        cur = None
        for name in graph.nodes:
            b = block_of.get(name)
            key = b if b is not None else "__glue__"
            if cur is None or cur[0] != key:
                cur = (key, [])
                units.append(cur)
            cur[1].append(name)
        units = _merge_reused(units)
        out, seen_block = [], False
        for i, (key, names) in enumerate(units):
            if key == "__glue__":
                later = any(k != "__glue__" for k, _ in units[i + 1:])
                nm = "prologue" if not seen_block else ("epilogue" if not later else f"glue.{i}")
                out.append(Unit(nm, "glue", nm, names, cut_before=False))
            else:
                seen_block = True
                out.append(Unit(key, "block", rep.get(key, key), names, cut_before=True))
        # the first block of the model can only start stage 0 if there is no prologue: harmless
        return out
    # No blocks: cut before key operators that start a new module (emit splits on module names), a
    # module seen before (e.g. a shared layer) never starts a stage.
    from sapp.capture.ir import KEY_KINDS
    cur, seen = None, set()
    for name, node in graph.nodes.items():
        mod = node.module
        new_unit = (cur is None or (node.kind in KEY_KINDS and mod and mod not in seen and cur.nodes))
        if new_unit:
            uname = mod if (cur is not None and mod) else (mod or "prologue")
            cur = Unit(uname, "block", uname, [], cut_before=cur is not None)
            units.append(cur)
            seen.add(mod)
        cur.nodes.append(name)
    return units


def template_units(template, units):
    """[(unit, its node names in `template`)] for the units the template holds (the glue and one
    block per type), in model order: the profile prices these and copies the rest."""
    out = []
    for u in units:
        names = [n for n in u.nodes if n in template.nodes]
        if names:
            out.append((u, names))
    return out


def _merge_reused(runs):
    """A block called again after other nodes ran (HRM's L and H stacks alternating over their
    cycles: the same weights at several points of the forward) cannot be cut from its other calls
    without its weights on two stages: from its first run to its last, the runs become one glue run
    (never a stage start).  Blocks called in one run each keep their cut points."""
    where = {}
    for i, (key, _) in enumerate(runs):
        if key != "__glue__":
            where.setdefault(key, []).append(i)
    spans = sorted((v[0], v[-1]) for v in where.values() if len(v) > 1)
    if not spans:
        return runs
    merged = [list(spans[0])]
    for a, b in spans[1:]:
        if a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    out, i = [], 0
    for a, b in merged:
        out += runs[i:a]
        out.append(("__glue__", [n for _, names in runs[a:b + 1] for n in names]))
        i = b + 1
    joined = []
    for key, names in out + runs[i:]:            # glue next to glue: one run
        if joined and key == "__glue__" == joined[-1][0]:
            joined[-1] = (key, joined[-1][1] + names)
        else:
            joined.append((key, names))
    return joined


def template_nodes(graph, units):
    """Node names of the template: all glue and the representative of each block type."""
    keep = []
    for u in units:
        if u.kind == "glue" or u.rep == u.name:
            keep.extend(u.nodes)
    return keep


@dataclass(frozen=True)
class SharedWeight:
    """A parameter read by operators of several units (a tied embedding and head; one position-bias
    module every layer calls): a pipeline stage holding a reader holds a copy of it (the emitter
    copies it into every stage that reads it and sums the copies' gradients, emit/pp/pipe.TiedGrads)."""
    name: str
    readers: tuple      # unit indices whose operators read it, ascending
    counted: tuple      # unit indices whose profiled states hold it already, ascending
    row: tuple          # (local numel, grad-sync group, link, trainable, None): profile.unit_params's row


def shared_weights(graph, units, template, strategies, mesh) -> tuple:
    """The SharedWeights of a model cut into `units` (its full graph `graph`; the profile's `template`
    graph, its `strategies` and stage `mesh`).  The profile prices a parameter in the template unit of
    its first reader (costmodel.param_owners), and every block copies its representative's numbers, so
    a weight a representative block reads is counted in each block of that type and one a glue unit
    reads in that unit only; a stage holding a reader but none of those has an unpriced copy."""
    from ..costmodel import param_owners
    from ..costmodel.gradsync import grad_sync_group
    unit_of = {n: j for j, u in enumerate(units) for n in u.nodes}
    readers = {}
    for name, node in graph.nodes.items():
        for p in node.params:
            readers.setdefault(p, set()).add(unit_of.get(name))
    out = []
    for owner, mine in param_owners(template).items():
        for p, trainable in mine.items():
            read = readers.get(p, set()) - {None}
            j = unit_of.get(owner)
            if j is None or len(read) < 2:
                continue
            rep = units[j].rep if units[j].kind == "block" else None
            counted = tuple(k for k, u in enumerate(units) if k == j or (rep is not None and u.rep == rep))
            node = template.nodes[owner]
            o = next(o for o in node.operands if o.param == p)
            s = tuple(strategies[owner])
            numel = float(o.numel)
            split = {}
            for d, lv in zip(s, mesh.levels):
                if d is not None:
                    split[d] = split.get(d, 1) * lv.size
            for d in set(o.dims):
                numel /= split.get(d, 1)
            k, link = grad_sync_group(s, mesh, o.dims)
            out.append(SharedWeight(p, tuple(sorted(read)), counted, (numel, k, link, bool(trainable), None)))
    return tuple(sorted(out, key=lambda w: w.name))
