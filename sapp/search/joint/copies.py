"""Weights several pipeline stages hold a copy of: their memory on each stage and the all-reduce of their
gradients between those stages.

A parameter read by operators of several units (GPT-2's embedding and tied head; x-transformers' one
relative-position bias, called by every attention layer) lands in every stage that reads it: the
emitter copies it there and, after backward, sums the copies' gradients over the stages holding one
(emit/pp/pipe.TiedGrads), as Megatron-LM does for the word embeddings of its first and last stage.
The profile prices each parameter in the unit of its first reader and the blocks that copy that
unit's numbers (pipeline.units.shared_weights); a stage holding a reader but none of those holds an
unpriced copy, added here.  Only ever added, so the memory bounds stay below what a stage needs."""
from __future__ import annotations

from bisect import bisect_left
from types import SimpleNamespace

from ...costmodel import collective_time
from ...pipeline.states import unit_states
from ...pipeline.units import shared_weights
from .numbers import held_states


def _weights(ctx, prof) -> tuple:
    """pipeline.units.shared_weights of the profile, once per profile (none without a pipeline)."""
    memo = prof.__dict__
    got = memo.get("_shared_weights")
    if got is None:
        got = memo["_shared_weights"] = shared_weights(ctx.graph, prof.units, prof.template, prof.strategies,
                                                       prof.mesh)
    return got


def weight_copies(ctx, cfg, prof) -> tuple:
    """[(readers, counted, held bytes with gradient accumulators, without, gradient bytes, trainable,
    {state: bytes} with accumulators)] of each shared weight under `cfg` (numbers.held_states of a unit
    holding only it); () at pp = 1."""
    if cfg.pp <= 1:
        return ()
    out = []
    for w in _weights(ctx, prof):
        unit = SimpleNamespace(states={z: unit_states([w.row], z, ctx.settings) for z in range(4)})
        held = [held_states(unit, cfg, acc) for acc in (True, False)]
        out.append((w.readers, w.counted, sum(held[0].values()), sum(held[1].values()),
                    w.row[0] * ctx.settings.grad_bytes, w.row[3], held[0]))
    return tuple(out)


def _hit(xs, a, b) -> bool:
    i = bisect_left(xs, a)
    return i < len(xs) and xs[i] < b


def copy_bytes(copies, a, b, acc=True) -> float:
    """Bytes a stage of units [a, b) holds for copies no unit of it was priced with."""
    return sum(w[2] if acc else w[3] for w in copies if _hit(w[0], a, b) and not _hit(w[1], a, b))


def copy_states(copies, a, b) -> dict:
    """copy_bytes (with accumulators) as {"params", "grads", "optimizer"} bytes, for the plan's record."""
    st = {"params": 0.0, "grads": 0.0, "optimizer": 0.0}
    for w in copies:
        if _hit(w[0], a, b) and not _hit(w[1], a, b):
            for k, v in w[6].items():
                st[k] += v
    return st


def tie_sync_s(ctx, cfg, copies, ranges) -> float:
    """Seconds of the all-reduces that sum each trainable shared weight's gradient over the pipeline
    ranks whose stages (`ranges`: each stage's [a, b) of units, stage i on pipeline rank i % pp) read it,
    once a step after the last backward; over nodes once a stage's dp x cp x tp ranks fill one."""
    link = "inter" if cfg.dp_cp * cfg.tp >= ctx.cluster.gpus_per_node else "intra"
    total = 0.0
    for readers, _, _, _, grad_bytes, trainable, _ in copies:
        ranks = {i % cfg.pp for i, (a, b) in enumerate(ranges) if _hit(readers, a, b)}
        if trainable and len(ranks) > 1:
            total += collective_time("all_reduce", grad_bytes, len(ranks), link, ctx.cluster)
    return total
