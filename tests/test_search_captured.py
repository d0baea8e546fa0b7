"""Cost model and search on graphs captured from the zoo (torch import + capture: ~5 s, shared by
the module's tests)."""
import pytest

from sapp.cluster import PRESETS
from sapp.costmodel import CostSettings, evaluate_sharding, saved_activations
from sapp.cluster.mesh import Mesh
from sapp.search import shard_search

A100 = PRESETS["a100-80g"]


@pytest.fixture(scope="module")
def gpt_tiny():
    import sapp.models as M
    from sapp.capture import capture
    return capture(M.get("gpt-tiny"), batch=8)


def test_captured_layer_activation_bytes_match_megatron(gpt_tiny):
    g = gpt_tiny
    mesh = Mesh.for_devices(A100, 1)
    # Megatron's figure assumes every float activation in bf16 (fused kernels, no autocast fp32 ops)
    saved = saved_activations(g, {n: () for n in g.nodes}, mesh, CostSettings(autocast_fp32=False))
    layer = set(g.blocks["layers.0"])
    got = sum(b for b, savers in saved.values() if savers[0] in layer)
    cfg = g.meta.get("config", {})
    s, b, h, a = cfg.get("s", 32), 8, cfg.get("h", 64), cfg.get("a", 4)
    assert got == pytest.approx(s * b * h * (34 + 5 * a * s / h), rel=0.05)


def test_captured_gpt_search_consistent_and_near_exact(gpt_tiny):
    g = gpt_tiny
    cl = A100.replace(gpus_per_node=4)
    mesh = Mesh.for_devices(cl, 4)
    rec = shard_search(g, mesh, cl)
    assert set(rec.strategies) == set(g.nodes)
    for n0, n1 in zip(g.blocks["layers.0"], g.blocks["layers.1"]):
        assert rec.strategies[n0] == rec.strategies[n1]
    again = evaluate_sharding(g, rec.strategies, mesh, cl, CostSettings())
    assert again.step_time_s == pytest.approx(rec.cost.step_time_s)
    ex = shard_search(g, mesh, cl, method="exact")
    assert rec.cost.step_time_s <= ex.cost.step_time_s * 1.01
    rep = evaluate_sharding(g, {n: (None,) * len(mesh.levels) for n in g.nodes}, mesh, cl, CostSettings())
    assert rec.cost.step_time_s <= rep.step_time_s
