"""Which template node a full-graph node shares its searched strategy with.

A stage profile searches one representative of each repeated block (`Profile.rep_of`); every other
block's nodes take the strategy of the representative's node at the same position."""
from __future__ import annotations


def template_map(graph, prof) -> dict:
    """Full-graph node -> template node whose strategy it shares (block nodes by position)."""
    out = {}
    blocks = graph.blocks
    for name, node in graph.nodes.items():
        b = node.block
        if b is None or prof.rep_of.get(b, b) == b:
            out[name] = name
            continue
        rep = prof.rep_of[b]
        out[name] = blocks[rep][blocks[b].index(name)]
    return out
