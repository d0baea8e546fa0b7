"""Tensor layouts per mesh level and the cost of moving between them.

A layout is a tuple with one code per mesh level: an int >= 0 is S(axis) (sharded along that tensor
axis), R (-1) replicated, P (-2) partial (each rank holds a summand of the full value)."""
from __future__ import annotations

from .primitives import link_params

R = -1
P = -2


def layout_str(code: int) -> str:
    return "R" if code == R else "P" if code == P else f"S({code})"


def output_layout(node, strategy) -> tuple:
    """Layout of the node's output: S where the output has the split dim, P where the op splits a
    dim the output lacks (contraction), R where the level replicates the op."""
    return _split_layout(node.out.dims, strategy)


def _split_layout(dims, strategy) -> tuple:
    """S where `dims` has the level's split dim, P where the op splits a dim it lacks, R otherwise."""
    out = []
    for d in strategy:
        if d is None:
            out.append(R)
        elif d in dims:
            out.append(dims.index(d))
        else:
            out.append(P)
    return tuple(out)


def input_layout(operand_dims, strategy) -> tuple:
    """Layout the op needs for an operand: S where the operand has the split dim, R otherwise."""
    return tuple(operand_dims.index(d) if (d is not None and d in operand_dims) else R for d in strategy)


def input_grad_layout(operand_dims, strategy) -> tuple:
    """Layout of the gradient the op produces for an operand: S where it has the split dim, P where
    the op splits a dim the operand lacks (the contributions of the shards must be summed), R else."""
    return _split_layout(operand_dims, strategy)


def output_grad_layout(out_layout) -> tuple:
    """Layout the producer needs its output gradient in: S where its output was S, R where R or P
    (the gradient of a pending sum is the same on every rank)."""
    return tuple(c if c >= 0 else R for c in out_layout)


def _group(levels, mesh):
    n, link = 1, "intra"
    for lv in levels:
        n *= mesh.levels[lv].size
        if mesh.levels[lv].link == "inter":
            link = "inter"
    return n, link


def reshard_time(src, dst, nbytes, mesh, cluster) -> float:
    """Seconds to turn a tensor of `nbytes` (full size) from layout `src` into `dst`.

    Order (cheapest first): local slices R->S (free), reductions P->S (reduce-scatter) and P->R
    (all-reduce), re-shards S(i)->S(j) (all-to-all), then gathers S->R (all-gather).  Levels with the
    same transition and axes are merged into one collective over the product group, whose link is the
    slowest crossed.  Each collective moves the tensor's size on its group: the full size divided by
    the shards held on the other levels at that moment."""
    if src == dst or nbytes <= 0:
        return 0.0
    a, b = reshard_coeffs(src, dst, mesh, cluster)
    return a + b * nbytes


def reshard_coeffs(src, dst, mesh, cluster):
    """(latency seconds, seconds per byte of the full tensor) of reshard_time: the alpha-beta ring
    costs are linear in the bytes, so one pair of layouts is priced once for every tensor size."""
    if src == dst:
        return 0.0, 0.0
    sizes = [lv.size for lv in mesh.levels]
    cur = list(src)
    for lv, (a, b) in enumerate(zip(src, dst)):
        if a == R and b >= 0:
            cur[lv] = b
    groups = {}
    for lv, (a, b) in enumerate(zip(src, dst)):
        if a == b or (a == R and b >= 0):
            continue
        if a == P:
            key = (0, "reduce_scatter", b) if b >= 0 else (1, "all_reduce", b)
        elif a >= 0 and b >= 0:
            key = (2, "all_to_all", (a, b))
        elif a >= 0 and b == R:
            key = (3, "all_gather", a)
        else:  # R -> P or S -> P: a pending sum is never needed; treat as free (take a share)
            cur[lv] = b
            continue
        groups.setdefault(key, []).append(lv)
    alpha_s = beta_s = 0.0
    for key in sorted(groups, key=lambda k: (k[0], str(k[2]))):
        lvs = groups[key]
        n, link = _group(lvs, mesh)
        other = 1
        for lv, c in enumerate(cur):
            if c >= 0 and lv not in lvs:
                other *= sizes[lv]
        kind = key[1]
        per_byte = 1.0 / other / (n if kind == "all_to_all" else 1)   # bytes moved per full-tensor byte
        if n > 1:
            lat, bw = link_params(link, cluster)
            steps = 2 * (n - 1) if kind == "all_reduce" else (n - 1)
            alpha_s += steps * lat
            beta_s += steps / n * per_byte / bw
        for lv in lvs:
            cur[lv] = dst[lv]
    return alpha_s, beta_s
