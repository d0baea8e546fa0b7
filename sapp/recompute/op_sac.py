"""torchtitan's op-level selective activation checkpointing (`activation_checkpoint.mode = "selective"`,
`selective_ac_option = "op"`), priced as torchtitan runs it: pure functions of a block's operators.

torchtitan 0.2.2 (73a0e69, torchtitan/distributed/activation_checkpoint.py `_apply_op_sac`, with the
`_op_sac_save_list` of torchtitan/models/llama3/infra/parallelize.py) wraps every transformer block in a
non-reentrant checkpoint whose policy MUST_SAVEs the outputs of

  - aten.mm.default, except every second one: the block's 2nd, 4th, 6th ... mm in forward order are
    recomputed (`meta[mm_count_key] % 2 == 0`), the 1st, 3rd, 5th ... saved.  A Llama block's mms run
    wq, wk, wv, wo, w1, w3, w2: wq, wv, w1 and w2 are kept, wk, wo and w3 recomputed;
  - the SDPA kernels (flash / efficient / cuDNN / math), flex and varlen attention;
  - _c10d_functional.reduce_scatter_tensor and aten.max (float8 scales), not priced here;

and recomputes every other operator (norms, rotary, SwiGLU's point-wise ops, views) from the block's
input and those outputs.  A linear layer with a bias runs aten.addmm, which the list does not name (not
counted, not saved); a matmul of two activations runs aten.bmm (idem).  The cache holds each saved
output whole whether or not backward reads it (w2's output included).  Not priced: the flash kernel's
fp32 log-sum-exp (heads x 4 bytes per token beside the h x 2 of its output)."""
from __future__ import annotations

from ..costmodel.layouts import output_layout
from ..costmodel.dtypes import out_bytes


def counted_mm(node) -> bool:
    """A bias-free linear layer: the one matmul of a block that dispatches aten.mm."""
    if node.kind != "matmul" or not node.params:
        return False
    return len(node.params) == 1


def kept_ops(graph, names) -> set:
    """The operators of one block (`names`, forward order) whose outputs the op-level policy saves."""
    mms = [n for n in names if counted_mm(graph.nodes[n])]
    kept = {n for i, n in enumerate(mms) if i % 2 == 0}
    return kept | {n for n in names if graph.nodes[n].kind == "attention"}


def kept_bytes(graph, kept, strategies, mesh, settings) -> float:
    """Bytes per device of the saved outputs `kept` (each whole, in its output layout)."""
    total = 0.0
    for n in kept:
        node = graph.nodes[n]
        k = 1
        for c, lv in zip(output_layout(node, tuple(strategies[n])), mesh.levels):
            if c >= 0:
                k *= lv.size
        total += node.out.numel * out_bytes(node, settings) / k
    return total


def recompute_seconds(names, kept, per_node) -> float:
    """Forward seconds backward spends recomputing a block: every operator not kept, without its share
    of the ZeRO-3 parameter gathers (backward gathers the block's weights once, before recomputing)."""
    return sum(per_node[n]["fwd_s"] - per_node[n].get("param_comm_s", 0.0) / 2 for n in names if n not in kept)
