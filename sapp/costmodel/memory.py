"""Activation memory: tensors kept for backward, each counted once, at its sharded size.

Peak memory as torch holds it.  A stage's prediction is params + grads + optimizer + activations +
transient, each what the emitted program holds (sapp/emit/runtime/memory_meter.py reads the same components
on every rank; tests/test_memory_rules.py measures each rule on one small module):
  - activations: what backward keeps (here) times the micro-batches in flight; dropout keeps a 1-byte
    mask where it runs fused (CUDA) and on a CPU its scaled noise at the input's width
    (`Cluster.fused_dropout` -> `CostSettings.dropout_noise`); p = 0 keeps nothing;
  - transient (search/joint/stage.py `transient`): at block j's backward, what j's recomputation saves
    again and plain ZeRO-3's gathers, less the stashes of the units after j, already freed;
  - FSDP2 (search/joint/numbers.py `gathered_params`, `held_states`): ZeRO-2 holds P/dp shards and the
    gathered P from forward to backward; plain ZeRO-3 nothing gathered after forward; a pipeline stage
    with m > 1 keeps each block gathered from its backward to the next forward; accumulating
    micro-batches hold the whole unsharded gradients where a forward follows a backward of the step;
    host tables are neither sharded nor gathered (sapp/placement/cost.py).
The torchtitan profile's loss backward (two fp32 gradients of the logits and the allocator's cached bf16
logits beside the stash) is a glue unit's `bwd_live` (costmodel/torchtitan.py, search/joint/stage.py).
Not priced: selective checkpointing's cache also keeps MUST_SAVE outputs no backward needs (one
(b, s, h) per selective block), and FSDP2's root unit holds its unsharded gradients through the whole
backward (ZeRO-2/3, m = 1), at activations below the forward peak."""
from __future__ import annotations

from .dtypes import ensure_widths, fused_alias, fusion_of, operand_bytes, out_bytes
from .fp8 import cached_width
from .grads import carries_grad, saved_for_backward
from .layouts import input_layout, output_layout


def _sharded(nbytes, layout, mesh):
    k = 1
    for c, lv in zip(layout, mesh.levels):
        if c >= 0:
            k *= lv.size
    return nbytes / k


def saved_items(node, strategy, mesh, settings):
    """(tensor id, bytes) for what `node` saves under `strategy`.  Tensor ids: the producer's name
    for an activation (so several savers share one id), "<node>:mask" for masks,
    "<node>:in<i>" for graph inputs without a producer node, "<producer>:cast><node>#<i>" for the
    copy autocast makes of an input it casts (a matmul saves the bf16 copy of an fp32 input, an
    fp32-list op the fp32 copy of a bf16 one).  Parameters are not activations."""
    out = []
    if not carries_grad(node):          # no backward node: autograd keeps nothing (costmodel.grads)
        return out
    for s in node.saves:
        if s == "out":
            lay = output_layout(node, strategy)
            out.append((node.name, _sharded(node.out.numel * out_bytes(node, settings), lay, mesh)))
        elif s == "mask":
            lay = output_layout(node, strategy)
            # a bool mask (fused dropout) or the scaled noise at the output's width (a CPU's dropout)
            width = out_bytes(node, settings) if settings.dropout_noise else 1
            out.append((node.name + ":mask", _sharded(node.out.numel * width, lay, mesh)))
        elif s.startswith("in"):
            i = int(s[2:])
            if i >= len(node.operands):
                continue
            o = node.operands[i]
            if o.param is not None or not saved_for_backward(node, i):
                continue
            if settings.fused and i in fusion_of(node)[2]:
                continue            # the fused kernel recomputes it in backward (costmodel.fusion)
            arrive, kept = operand_bytes(node, i, settings)
            numel = o.numel
            alias = fused_alias(node, i) if settings.fused and kept == arrive else None
            f8 = cached_width(node, i, settings) if settings.fp8 else 0.0
            if f8 and o.producer is not None:
                tid, kept = f"{o.producer}:fp8", f8     # Transformer Engine keeps the FP8 copy (costmodel/fp8.py)
            elif alias is not None:
                tid, numel = alias      # kept as another tensor by the fused kernels (costmodel.fusion)
            elif o.producer is None:
                tid = f"{node.name}:in{i}"
            elif kept != arrive:
                tid = f"{o.producer}:cast>{node.name}#{i}"
            else:
                tid = o.producer
            lay = input_layout(o.dims, strategy)
            out.append((tid, _sharded(numel * kept, lay, mesh)))
    return out


def saved_activations(graph, strategies, mesh, settings) -> dict:
    """{tensor id: (bytes per device, [saver nodes])}.  A tensor saved by several ops is counted once,
    at the size in the layout of its first saver in topological order."""
    ensure_widths(graph)
    res = {}
    for node in graph.nodes.values():
        for tid, b in saved_items(node, strategies[node.name], mesh, settings):
            if tid in res:
                res[tid][1].append(node.name)
            else:
                res[tid] = (b, [node.name])
    return res
