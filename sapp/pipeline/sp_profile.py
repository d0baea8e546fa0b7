"""Stage-profile pieces of sequence parallelism (sapp/search/sp_layout.py): the region entries' saved
inputs kept as sequence shards and re-gathered in backward (Megatron; sapp/emit/tp/sp.py does the same),
and the sequence-sharded activation a stage boundary sends."""
from __future__ import annotations

from ..costmodel import collective_time, saved_items


def sp_node_set(graph, strategies, mesh, roles):
    """sp_layout.sp_nodes on the mesh's tp level (empty without one): what sp_regather and
    sp_out_shards both read, computed once by a caller that needs both."""
    from ..search.sp_layout import sp_nodes
    if not roles or "tp" not in roles:
        return set()
    lv = roles.index("tp")
    return sp_nodes(graph, strategies, lv, mesh.levels[lv].size)


def sp_regather(graph, strategies, mesh, roles, settings, sp=None):
    """{(opener, tensor id): tp} for the inputs of sequence-parallel region entries: a column-split
    linear whose input arrives sequence-sharded all-gathers it in forward; like Megatron, the emitter
    (sapp/emit/tp/sp.py) saves only this rank's shard for backward and gathers it again there, so the
    saved input costs 1/tp (Korthikanti 2022: 34/t) and backward pays one more all-gather
    (`sp_regather_time`)."""
    from ..search.sp_layout import sp_nodes
    lv = (roles or ()).index("tp") if "tp" in (roles or ()) else None
    if lv is None:
        return {}
    tp = mesh.levels[lv].size
    sp = sp_nodes(graph, strategies, lv, tp) if sp is None else sp
    out = {}
    for n, node in graph.nodes.items():
        s = strategies.get(n) or ()
        if node.kind != "matmul" or lv >= len(s) or s[lv] != "n":
            continue
        for tid, nbytes in saved_items(node, tuple(s), mesh, settings):
            if tid in sp:       # (an autocast copy is another tensor: saved whole, as the emitter does)
                out[(n, tid)] = (tp, nbytes)
    return out


def sp_regather_time(graph, regather, names, mesh, roles, cluster, settings):
    """Backward seconds of the re-gathers (see sp_regather) of the openers among `names`."""
    if not regather:
        return 0.0
    tp = mesh.levels[roles.index("tp")].size
    # saved_items' bytes are this rank's rows (the dp level shards the batch), gathered over tp
    return sum(collective_time("all_gather", nbytes, tp, "intra", cluster)
               for (n, _), (_, nbytes) in regather.items() if n in names)


def sp_out_shards(graph, strategies, mesh, roles, sp=None):
    """{node: tp} for the sequence-parallel nodes: a stage boundary after one sends its sequence shard
    (1/tp of the activation per tp rank, Megatron's scatter/gather with the gather left to the next
    region's entry, which all-gathers anyway)."""
    from ..search.sp_layout import sp_nodes
    if not roles or "tp" not in roles:
        return {}
    lv = roles.index("tp")
    tp = mesh.levels[lv].size
    return {n: tp for n in (sp_nodes(graph, strategies, lv, tp) if sp is None else sp)}
