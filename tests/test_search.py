"""Sharding search: recursive vs exact vs exhaustive on the same objective, memory budget, roles,
repeated blocks, errors."""
import random

import pytest

from sapp.cluster import PRESETS
from sapp.costmodel import CostSettings, evaluate_sharding
from sapp.errors import SappError
from sapp.cluster.mesh import Level, Mesh
from sapp.search import shard_search
from sapp.search.problem import Problem
from bench.random_graphs import gpt_graph, mlp_graph, random_graph

A100 = PRESETS["a100-80g"]
CPU = PRESETS["cpu"]


def mesh_of(cluster, nodes, gpus):
    c = cluster.replace(nodes=nodes, gpus_per_node=gpus)
    return c, Mesh.for_devices(c, nodes * gpus)


@pytest.mark.parametrize("seed", range(6))
def test_recursive_equals_exhaustive_on_tiny_graphs(seed):
    cl, mesh = mesh_of(A100 if seed % 2 else CPU, 1 + seed % 2, 2)
    g = random_graph(100 + seed, n_nodes=3 + seed % 2)
    rec = shard_search(g, mesh, cl, method="recursive")
    exh = shard_search(g, mesh, cl, method="exhaustive")
    ex = shard_search(g, mesh, cl, method="exact")
    assert exh.cost.step_time_s == pytest.approx(ex.cost.step_time_s, rel=1e-6)
    assert rec.cost.step_time_s == pytest.approx(exh.cost.step_time_s, rel=1e-9)


# One sample of the quality benchmark (bench/search_quality.py runs the full set).
@pytest.mark.parametrize("seed,shape", [(1, (1, 4)), (2, (2, 2)), (3, (1, 6)), (4, (2, 4)), (5, (1, 8))])
def test_recursive_within_one_percent_of_exact(seed, shape):
    cl, mesh = mesh_of(A100, *shape)
    g = random_graph(seed, n_nodes=6, scale="large" if seed % 2 else "mid")
    rec = shard_search(g, mesh, cl)
    ex = shard_search(g, mesh, cl, method="exact")
    assert rec.cost.step_time_s <= ex.cost.step_time_s * 1.01
    assert ex.cost.step_time_s <= rec.cost.step_time_s * (1 + 1e-6)   # exact really is a lower bound


def test_objective_matches_evaluate_sharding():
    g = gpt_graph(layers=3, b=4, s=128, h=256, a=4, vocab=1024)
    cl, mesh = mesh_of(A100, 1, 4)
    prob = Problem(g, mesh, cl, CostSettings())
    assert len(prob.vars) < len(g.nodes)                  # layers 1, 2 share layer 0's variables
    rng = random.Random(0)
    strat = [rng.choice(prob.strategies(v)) for v in range(len(prob.vars))]
    cost = evaluate_sharding(g, prob.expand(strat), mesh, cl, CostSettings())
    assert prob.energy(strat) == pytest.approx(cost.step_time_s, rel=1e-9)
    assert prob.memory(strat) == pytest.approx(cost.peak_memory_bytes, rel=1e-9)


def test_repeated_blocks_share_strategy_and_beat_fixed_plans():
    g = gpt_graph(layers=4, b=8, s=512, h=1024, a=16, vocab=8192)
    cl, mesh = mesh_of(A100, 1, 8)
    res = shard_search(g, mesh, cl)
    for name in g.blocks["layers.0"]:
        short = name.split(".", 2)[2]
        assert all(res.strategies[f"layers.{i}.{short}"] == res.strategies[name] for i in range(1, 4))
    assert res.cost.step_time_s == pytest.approx(
        evaluate_sharding(g, res.strategies, mesh, cl, CostSettings()).step_time_s)
    # no worse than pure data parallelism or everything replicated
    dp = {n: tuple(next((d.name for d in node.dims if d.batch), None) for _ in mesh.levels)
          for n, node in g.nodes.items()}
    rep = {n: (None,) * len(mesh.levels) for n in g.nodes}
    for other in (dp, rep):
        assert res.cost.step_time_s <= evaluate_sharding(g, other, mesh, cl, CostSettings()).step_time_s + 1e-12


def test_level_roles_pin_degrees():
    g = gpt_graph(layers=2, b=8, s=256, h=1024, a=16, vocab=4096)
    cl, mesh = mesh_of(A100, 1, 8)
    roles = ("dp", "tp", "tp")
    res = shard_search(g, mesh, cl, level_roles=roles)
    for name, s in res.strategies.items():
        node = g.nodes[name]
        assert s[0] is None or node.dim(s[0]).batch
        assert all(c is None or not node.dim(c).batch for c in s[1:])
    with pytest.raises(SappError):
        shard_search(g, mesh, cl, level_roles=("dp", "tp"))
    with pytest.raises(SappError):
        shard_search(g, mesh, cl, level_roles=("dp", "pp", None))
    with pytest.raises(SappError):      # batch 8 cannot be split 16 ways
        big = Mesh((Level(2, "inter"),) + mesh.levels)
        shard_search(g, big, cl, level_roles=("dp",) * 4)
    with pytest.raises(SappError):
        shard_search(g, mesh, cl, method="annealing")


def test_memory_budget_enforced_and_infeasible_reported():
    g = mlp_graph(b=32, s=128, h=4096)
    cl, mesh = mesh_of(A100, 1, 8)
    free = shard_search(g, mesh, cl)
    least = shard_search(g, mesh, cl, memory_budget=1e3)     # nothing fits 1 kB
    assert not least.feasible and least.memory_bytes < free.memory_bytes
    budget = (free.memory_bytes + least.memory_bytes) / 2
    tight = shard_search(g, mesh, cl, memory_budget=budget)
    assert tight.feasible and tight.memory_bytes <= budget
    assert tight.cost.step_time_s >= free.cost.step_time_s
    exact = shard_search(g, mesh, cl, memory_budget=budget, method="exact")
    assert exact.feasible and exact.memory_bytes <= budget
    assert tight.cost.step_time_s <= exact.cost.step_time_s * 1.01


def test_megatron_emerges_for_a_wide_mlp_on_fast_links():
    # batch 1: data parallelism is impossible beyond the sequence, tensor parallelism must be found
    g = mlp_graph(b=1, s=8, h=8192)
    cl, mesh = mesh_of(A100, 1, 8)
    res = shard_search(g, mesh, cl, level_roles=("tp",) * 3)
    assert set(res.strategies["fc1"]) <= {"n", "k"} and None not in res.strategies["fc1"]
    assert res.cost.compute_s < evaluate_sharding(
        g, {n: (None,) * 3 for n in g.nodes}, mesh, cl, CostSettings()).compute_s / 4
