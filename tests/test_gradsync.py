"""One gradient-sync pricing for every search (issue 14, item 5): the sharding search adds up each
operator's share (`node_cost`), the joint search's stage profile adds up each unit's; they must be the
same function of the same parameters, so both searches optimise one objective.  Expected values are
the ring formulas of REFERENCE.md worked by hand from the parameter count."""
import pytest

from bench.random_graphs import gpt_graph
from sapp.cluster import Cluster
from sapp.costmodel import CostSettings, evaluate_sharding
from sapp.pipeline.profile import build_profile, rebatch

L, H = 2, 256


@pytest.fixture(scope="module")
def graph():
    return gpt_graph(layers=L, b=8, s=128, h=H, a=4, vocab=1024)


def _block_params(graph, block):
    return sum(p.numel for name, p in graph.params.items() if name.startswith(block + "."))


@pytest.mark.parametrize("spec", ["a100-80g:nodes=1",
                                  "cpu:gpus=8,fsdp_unit_overhead=0.002,fsdp_tensor_overhead=0.0001"])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_profile_sync_is_the_sum_of_the_operators_sync(graph, spec, zero):
    c = Cluster.parse(spec)
    st = CostSettings(precision="bf16-mixed", zero=zero, grad_sync_overlap=0.25)
    prof = build_profile(graph, c, st, 8, 1)
    per_node = evaluate_sharding(rebatch(prof.template, 8), prof.strategies, prof.mesh, c, st).per_node
    serial_fsdp = zero >= 2 and not c.async_launch
    for u in prof.units:
        if u.kind != "block" or u.rep != u.name:
            continue
        ops = sum(per_node[n]["grad_sync_s"] for n in u.nodes if n in per_node)
        unit = u.grad_sync[zero] - (0.75 * c.fsdp_unit_overhead if serial_fsdp else 0.0)
        assert unit == pytest.approx(ops, rel=1e-9)


def test_a_blocks_sync_by_hand(graph):
    """dp = 8 over NVLink, ZeRO-0, bf16 gradients: one bucket per block, the all-reduce's
    bandwidth 2(n-1)/n * 2 B * params / beta per block, and its latency 2(n-1) alpha once."""
    c = Cluster.parse("a100-80g:nodes=1")
    prof = build_profile(graph, c, CostSettings(precision="bf16-mixed", zero=0), 8, 1)
    n = _block_params(graph, "layers.0")
    # q, k, v, proj (h x h + bias each), fc1 (4h x h + 4h), fc2 (h x 4h + h), two layer norms (2h each)
    assert n == 4 * (H * H + H) + (4 * H * H + 4 * H) + (4 * H * H + H) + 4 * H
    u = next(u for u in prof.units if u.name == "layers.0")
    assert u.grad_sync[0] == pytest.approx(2 * 7 / 8 * 2 * n / c.intra_bw, rel=1e-9)
    assert u.sync_lat[0] == pytest.approx(2 * 7 * c.intra_latency, rel=1e-9)
