"""costmodel.grads: only what autograd differentiates has a backward.  On a captured HF Llama (tiny
config on meta) the rotary cos/sin and the mask ops carry no gradient: no backward kernel, no
gradient resharding on their edges, nothing saved by them; q * cos keeps cos only."""
import os
import sys

import pytest

pytest.importorskip("transformers")

from sapp.costmodel import CostSettings, node_cost  # noqa: E402
from sapp.costmodel.dtypes import ensure_widths  # noqa: E402
from sapp.costmodel.edges import edge_times  # noqa: E402
from sapp.costmodel.grads import carries_grad, saved_for_backward  # noqa: E402
from sapp.costmodel.memory import saved_items  # noqa: E402
from sapp.cluster import Cluster  # noqa: E402
from sapp.cluster.mesh import Level, Mesh  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.emit_workers import hf_models  # noqa: E402


@pytest.fixture(scope="module")
def graph():
    from sapp.api import capture_graph
    model, _ = hf_models.build("llama", device="meta")
    x, _ = hf_models.batch("llama", 8, 0)
    g = capture_graph(model, x)[0]
    ensure_widths(g)
    return g


def _by_target(g, op, block="model.layers.0"):
    return [n for n in g.nodes.values() if n.target == f"aten.{op}" and n.block == block]


def test_rotary_tables_and_masks_carry_no_gradient(graph):
    cos = [n for n in graph.nodes.values() if n.target == "aten.cos.default"]
    assert cos and not any(carries_grad(n) for n in cos)
    masks = [n for n in graph.nodes.values() if n.out.dtype == "bool"]
    assert masks and not any(carries_grad(n) for n in masks)
    lin = [n for n in graph.nodes.values() if n.kind == "matmul" and n.params]
    assert lin and all(carries_grad(n) for n in lin)
    assert all(carries_grad(graph.nodes[o]) for o in graph.outputs)       # the logits


def test_no_backward_for_what_carries_no_gradient(graph):
    cl = Cluster.parse("a100-80g:nodes=2")
    mesh = Mesh((Level(16, "inter"),))
    st = CostSettings(precision="bf16-mixed")
    cos = next(n for n in graph.nodes.values() if n.target == "aten.cos.default")
    assert node_cost(cos, (None,), mesh, cl, st).bwd_s == 0.0 and saved_items(cos, (None,), mesh, st) == []
    # q * cos: batch-split on the data-parallel level, cos replicated.  Its gradient would be a partial sum
    # over the batch (an all-reduce over 16 ranks); autograd never computes it
    for mul in _by_target(graph, "mul.Tensor"):
        ops = [o for o in mul.operands if o.producer is not None]
        srcs = [graph.nodes[o.producer] for o in ops]
        if len(ops) == 2 and carries_grad(srcs[0]) and not carries_grad(srcs[1]) and len(ops[0].dims) == 4:
            break
    else:
        raise AssertionError("no q * cos product found")
    s = ("a0",)
    fwd, bwd = edge_times(srcs[1], ops[1], (None,), s, mesh, cl, st)
    assert bwd == 0.0
    # it keeps cos (for q's gradient), not q (cos needs none)
    i_q, i_cos = mul.operands.index(ops[0]), mul.operands.index(ops[1])
    assert saved_for_backward(mul, i_cos) and not saved_for_backward(mul, i_q)
    ids = [tid for tid, _ in saved_items(mul, s, mesh, st)]
    assert ops[1].producer in ids and ops[0].producer not in ids


def _qkv_reshards(graph, sp, runtime):
    """Resharding seconds booked to layer 0's q, k, v projections at tp=2 (Megatron regions forced)."""
    from sapp.costmodel import evaluate_sharding
    from sapp.search import sp_layout, tp_layout
    cl = Cluster.parse("a100-80g:nodes=1")
    mesh = Mesh((Level(2, "intra"),))
    choice = {n: "n" for n in tp_layout.linears(graph)}
    strategies, _, _ = tp_layout.emittable(graph, choice, 2)
    if sp:
        strategies = sp_layout.sp_choice(graph, strategies, 2)
    st = CostSettings(precision="bf16-mixed", runtime=runtime)
    cost = evaluate_sharding(graph, {n: (d,) for n, d in strategies.items()}, mesh, cl, st)
    names = [n for n, node in graph.nodes.items()
             if node.module in {f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")}]
    return [cost.per_node[n]["reshard_s"] for n in names]


def test_one_input_of_several_linears_moves_once_where_the_program_moves_it_once(graph):
    # sequence parallelism: the attention module's entry all-gathers the norm's output once for q, k
    # and v (emit/sp.py), and reduce-scatters the summed gradient once
    r = _qkv_reshards(graph, True, "eager")
    assert len(r) == 3 and r[0] > 0 and r[1] == r[2] == 0.0
    # no SP, eager DTensor: each ColwiseParallel all-reduces its own input gradient
    r = _qkv_reshards(graph, False, "eager")
    assert r[0] > 0 and r[1] == pytest.approx(r[0]) and r[2] == pytest.approx(r[0])
    # the fused runtime (Megatron's fused QKV): one all-reduce of the input gradient
    r = _qkv_reshards(graph, False, "fused")
    assert r[0] > 0 and r[1] == r[2] == 0.0
