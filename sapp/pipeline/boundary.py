"""What a pipeline stage boundary sends, read off the captured graph (pure Python, no torch).

A cut after unit j sends every tensor produced at or before j that a unit after j (or the model's
output) reads.  The unit's own output is the boundary activation the profile always priced
(`Unit.out_bytes`), when it crosses (`Unit.out_crosses`: an HF prologue ends with the rotary sin,
which does not); this module finds the others, the *side* tensors (`Unit.side`):
- position-only tensors -- built from shapes, constants and buffers alone (HF's causal mask, rotary
  cos/sin, positions) -- are NOT sent: the emitter gives every stage its own copy of the ops
  producing them (sapp/emit/pp/stage_local.py, same rule on the exported graph), so they cost nothing
  at the boundary;
- every other one is sent with each forward (e.g. a padding mask built from an `attention_mask`
  input, T5's encoder output crossing the decoder's cuts), and its gradient comes back only when it
  carries one (it depends on a trainable parameter through differentiable ops): a mask does not.
Per device, as the emitted pipeline sends it: the dp shard when the tensor has the batch dim, the
sequence shard where sequence parallelism splits it, whole on every tp rank otherwise."""
from __future__ import annotations

from ..costmodel.dtypes import out_bytes
from .sp_profile import sp_out_shards

_FLOATS = ("float32", "float16", "bfloat16", "float64")
# ops whose values differ between two runs (or are undefined): never copied into another stage
_RANDOM = ("rand", "bernoulli", "normal", "uniform", "multinomial", "poisson", "exponential", "empty", "dropout")


def _op_name(target: str) -> str:
    parts = target.split(".")
    return parts[1] if len(parts) > 1 else target


def _deterministic(node) -> bool:
    name = _op_name(node.target)
    in_place = name.endswith("_") and not name.endswith("__")        # add_, not __and__
    return node.kind != "dropout" and not in_place and not any(r in name for r in _RANDOM)


def position_only(graph) -> set:
    """Names of the nodes whose value depends on shapes, constants and buffers alone."""
    out = set()
    for name, node in graph.nodes.items():
        if node.kind == "input" or not _deterministic(node):
            continue
        ok = True
        for o in node.operands:
            if o.producer is not None and o.producer not in out:
                ok = False
            elif o.param is not None:
                info = graph.params.get(o.param)
                ok = ok and info is not None and not info.trainable
        if ok:
            out.add(name)
    return out


def carries_grad(graph) -> set:
    """Names of the floating-point nodes that depend on a trainable parameter (their gradient flows
    back across a boundary)."""
    out = set()
    for name, node in graph.nodes.items():
        if node.out.dtype not in _FLOATS or "detach" in _op_name(node.target):
            continue
        for o in node.operands:
            info = graph.params.get(o.param) if o.param is not None else None
            if (o.producer is not None and o.producer in out) or (info is not None and info.trainable):
                out.add(name)
                break
    return out


def _target(graph) -> str | None:
    """The loss's target input (capture's WithLoss takes it as `target`): the emitted pipeline hands
    it to the last stage's loss function directly, it never crosses a boundary."""
    has_loss = any(n.kind == "loss" for n in graph.nodes.values())
    node = graph.nodes.get("target")
    return "target" if has_loss and node is not None and node.kind == "input" else None


def side_tensors(graph, units) -> list:
    """Per unit j: (the names of the tensors besides j's output that a cut right after j sends,
    whether j's output itself crosses: not when it is position-only or nothing after j reads it)."""
    where = {n: j for j, u in enumerate(units) for n in u.nodes}
    last = {}                      # producer -> the last unit reading it (len(units): the output)
    for name, node in graph.nodes.items():
        for p in node.producers:
            if p in where and name in where:
                last[p] = max(last.get(p, -1), where[name])
    for o in graph.outputs:
        if o in where:
            last[o] = len(units)
    skip = position_only(graph) | {_target(graph)}
    out = [([], False) for _ in units]
    for p, end in last.items():
        if p in skip:
            continue
        for j in range(where[p], min(end, len(units))):
            if units[j].nodes and units[j].nodes[-1] == p:
                out[j] = (out[j][0], True)
            else:
                out[j][0].append(p)
    return out


def template_names(units) -> dict:
    """Full-graph node name -> the name of the same node in the template (a block that is not its
    type's representative maps onto the representative's nodes, position by position)."""
    first = {}
    for u in units:
        first.setdefault(u.rep if u.kind == "block" else u.name, u)
    out = {}
    for u in units:
        rep = first[u.rep if u.kind == "block" else u.name]
        out.update(zip(u.nodes, rep.nodes))
    return out


def side_bytes(template, names, grads, strategies, dp, seq, settings, captured) -> tuple:
    """(forward floating-point, forward other, backward) bytes per device of the tensors `names`
    (template names) at the batch `template` was rebatched to (dp x micro-batch): what the emitter's
    scatter/gather may cut (floating point), what it sends whole (integer, boolean), and the gradients
    coming back.  A tensor with a batch dim is the dp shard; one whose batch the capture could not
    follow (HF indexes the mask input with `arange(batch)`: rebatching keeps its rows) but whose first
    dim is the captured batch `captured` counts per sample all the same, as the emitted stage sends
    its micro-batch's rows; anything else is sent whole."""
    fl = other = bwd = 0.0
    b = template.batch_size / dp            # the micro-batch
    for n in names:
        node = template.nodes.get(n)
        if node is None:
            continue
        size = node.out.numel * out_bytes(node, settings)
        if any(d.batch for d in node.dims if d.name in node.out.dims):
            split = strategies.get(n, (None,))[0] if dp > 1 else None
            size /= dp if split in node.out.dims else 1
        elif captured > 1 and node.out.shape and node.out.shape[0] == captured:
            size *= b / captured
        size /= seq.get(n, 1)
        if node.out.dtype in _FLOATS:
            fl += size
        else:
            other += size
        if n in grads:
            bwd += size
    return fl, other, bwd


def fill_side(graph, units, out_units, cache, batches, strategies, mesh, roles, settings, dp):
    """Set each profile unit's `side` (affine in the micro-batch size): the side tensors a stage
    boundary right after it sends, per device, from the templates rebatched to micro-batches 1 and
    2 (`batches`).  `cache`: the search's graph cache (the names are structural: found once)."""
    if "sides" not in cache:
        tmap = template_names(units)
        found = side_tensors(graph, units)
        cache["sides"] = ([[tmap.get(n, n) for n in names] for names, _ in found], [c for _, c in found],
                          {tmap.get(n, n) for n in carries_grad(graph)})
    sides, crosses, grads = cache["sides"]
    for nu, c in zip(out_units, crosses):
        nu.out_crosses = c
    if not any(sides):
        return
    shards = [sp_out_shards(t, strategies, mesh, roles) for t in batches]    # once a template, not a side
    vals = [[side_bytes(t, names, grads, strategies, dp, sh, settings, graph.batch_size) for names in sides]
            for t, sh in zip(batches, shards)]
    for nu, one, two in zip(out_units, *vals):
        nu.side = tuple((2 * x - y, y - x) for x, y in zip(one, two))
