"""Cost model: formulas, resharding semantics, Megatron communication pattern, activation memory."""
import math

import pytest

from sapp.cluster import PRESETS, Cluster
from sapp.costmodel import (CostSettings, collective_time, compute_time, edge_cost, edge_times, evaluate_sharding,
                            model_state_bytes, node_cost, op_strategies, reshard_time, saved_activations)
from sapp.costmodel.layouts import P, R
from sapp.costmodel.primitives import staging_copy_time
from sapp.errors import SappError
from sapp.cluster.mesh import Level, Mesh
from bench.random_graphs import gpt_graph, mlp_graph

A100 = PRESETS["a100-80g"]
BF16 = CostSettings()
MEGATRON = CostSettings(autocast_fp32=False)    # every float activation bf16: Megatron's fused kernels


def megatron(graph, levels):
    """Megatron-LM tensor parallelism on every level."""
    tp = {"ln1": None, "q": "n0", "k": "n0", "v": "n0", "scores": "b1", "softmax": "a1", "attn_drop": "a1",
          "context": "b1", "proj": "k0", "drop1": None, "add1": None, "ln2": None, "fc1": "n", "gelu": "a2",
          "fc2": "k", "drop2": None, "add2": None}
    out = {}
    for name, node in graph.nodes.items():
        short = name.split(".")[-1] if node.block else name
        out[name] = (tp.get(short) if node.block else None,) * levels
    return out


def test_collective_formulas():
    c = A100
    B = 1e9
    assert collective_time("all_reduce", B, 8, "intra", c) == pytest.approx(2 * 7 * 5e-6 + 2 * 7 / 8 * B / 300e9)
    for kind in ("all_gather", "reduce_scatter", "all_to_all"):
        assert collective_time(kind, B, 4, "inter", c) == pytest.approx(3 * 10e-6 + 3 / 4 * B / 25e9)
    assert collective_time("p2p", B, 2, "inter", c) == pytest.approx(10e-6 + B / 25e9)
    assert collective_time("all_reduce", B, 1, "intra", c) == 0.0
    with pytest.raises(SappError):
        collective_time("broadcast", B, 2, "intra", c)
    with pytest.raises(SappError):
        collective_time("all_reduce", B, 2, "ethernet", c)


def test_compute_roofline():
    c = A100
    assert compute_time(1e12, 0, c) == pytest.approx(1e12 / (312e12 * 0.8))
    assert compute_time(1e3, 1e9, c) == pytest.approx(1e9 / (2e12 * 0.8))


def test_op_overhead_serial_adds_async_overlaps():
    serial = A100.replace(op_overhead=10e-6, async_launch=False)
    roof = 1e9 / (2e12 * 0.8)                                    # 625 us, memory-bound
    assert compute_time(1e3, 1e9, serial, launches=2) == pytest.approx(roof + 2 * 10e-6)
    asyn = A100.replace(op_overhead=10e-6, async_launch=True)
    assert compute_time(1e3, 1e9, asyn, launches=2) == pytest.approx(roof)     # hidden behind the kernel
    assert compute_time(1e3, 1e3, asyn, launches=2) == pytest.approx(20e-6)    # launch-bound tiny op
    assert compute_time(1e3, 1e9, serial) == pytest.approx(roof)              # no launches: roofline only


def test_dropout_is_bounded_by_random_draws():
    # a third roofline limit: one random draw per output element in forward, none in backward
    c = A100.replace(op_overhead=0.0, rng_rate=1e8)
    assert compute_time(1e3, 1e3, c, randoms=1e6) == pytest.approx(1e6 / 1e8)
    assert compute_time(1e3, 1e9, c, randoms=1e3) == pytest.approx(1e9 / (2e12 * 0.8))
    g = gpt_graph(layers=1)
    drop = next(n for n in g.nodes.values() if n.kind == "dropout")
    mesh = Mesh((Level(2, "intra"),))
    bdim = next(d.name for d in drop.dims if d.batch)
    nc = node_cost(drop, (bdim,), mesh, c, BF16)
    assert nc.fwd_s == pytest.approx(drop.out.numel / 2 / 1e8)        # half the elements per device
    assert nc.bwd_s < nc.fwd_s / 100                                   # backward applies the saved mask
    assert node_cost(drop, (bdim,), mesh, A100, BF16).fwd_s < nc.fwd_s / 100   # GPUs: memory-bound


def test_node_cost_charges_launches_per_kernel():
    from sapp.costmodel.nodes import launches_of
    g = gpt_graph(layers=1)
    mesh = Mesh((Level(1, "intra"),))
    fc1 = next(n for n in g.nodes.values() if n.kind == "matmul" and n.params)
    ew = next(n for n in g.nodes.values() if n.kind in ("elementwise", "dropout"))
    base = A100.replace(op_overhead=0.0)
    serial = A100.replace(op_overhead=10e-6, async_launch=False)
    for node, bwd_launches in ((fc1, 2), (ew, 1)):
        assert launches_of(node.kind, True, False) == bwd_launches
        c0 = node_cost(node, (None,), mesh, base, BF16)
        c1 = node_cost(node, (None,), mesh, serial, BF16)
        assert c1.fwd_s - c0.fwd_s == pytest.approx(10e-6)
        assert c1.bwd_s - c0.bwd_s == pytest.approx(bwd_launches * 10e-6)
    assert launches_of("view", False, False) == 1 and launches_of("view", False, True) == 0
    assert launches_of("input", False, False) == 0


def test_zero_model_state_formulas():
    gb = lambda d: sum(d.values()) / 1e9
    psi = 7.5e9
    assert gb(model_state_bytes(psi, 64, 0, BF16)) == pytest.approx(120, rel=1e-3)
    assert gb(model_state_bytes(psi, 64, 1, BF16)) == pytest.approx(31.4, abs=0.05)
    assert gb(model_state_bytes(psi, 64, 2, BF16)) == pytest.approx(16.6, abs=0.05)
    assert gb(model_state_bytes(psi, 64, 3, BF16)) == pytest.approx(1.875, rel=1e-3)
    assert gb(model_state_bytes(psi, 1, 0, CostSettings(precision="fp32"))) == pytest.approx(16 * 7.5)


def test_settings_validation():
    with pytest.raises(SappError):
        CostSettings(precision="fp8")
    with pytest.raises(SappError):
        CostSettings(zero=4)


def test_op_strategies_divisibility():
    g = mlp_graph(b=6, s=4, h=8)
    mesh = Mesh((Level(2, "intra"), Level(2, "intra")))
    st = op_strategies(g.nodes["fc1"], mesh)
    assert (None, None) in st and ("b1", "b1") in st and ("n", "k") in st
    assert ("b0", "b0") not in st            # 6 is not divisible by 4
    assert ("b0", "b1") in st
    assert all(len(s) == 2 for s in st)
    assert len(set(st)) == len(st)
    dp_only = op_strategies(g.nodes["fc1"], mesh, roles=("dp", "tp"))
    assert all(s[0] in (None, "b0") and s[1] in (None, "b1", "n", "k") for s in dp_only)


def test_reshard_transitions():
    mesh = Mesh((Level(2, "inter"), Level(4, "intra")))
    c, B = A100, 8e6
    assert reshard_time((R, R), (0, 1), B, mesh, c) == 0.0                       # local slices
    assert reshard_time((0, R), (R, R), B, mesh, c) == pytest.approx(collective_time("all_gather", B, 2, "inter", c))
    # gather on the intra level only: the inter level keeps half of the tensor
    assert reshard_time((0, 1), (0, R), B, mesh, c) == pytest.approx(collective_time("all_gather", B / 2, 4, "intra", c))
    assert reshard_time((R, P), (R, R), B, mesh, c) == pytest.approx(collective_time("all_reduce", B, 4, "intra", c))
    assert reshard_time((R, P), (R, 0), B, mesh, c) == pytest.approx(collective_time("reduce_scatter", B, 4, "intra", c))
    assert reshard_time((R, 0), (R, 1), B, mesh, c) == pytest.approx(collective_time("all_to_all", B / 4, 4, "intra", c))
    # both levels partial: one all-reduce over 8 ranks, limited by the inter link
    assert reshard_time((P, P), (R, R), B, mesh, c) == pytest.approx(collective_time("all_reduce", B, 8, "inter", c))


def test_megatron_mlp_one_allreduce_each_way():
    g = mlp_graph(b=4, s=512, h=1024)
    mesh = Mesh.for_devices(A100, 8)
    L = len(mesh.levels)
    st = {"x": (None,) * L, "fc1": ("n",) * L, "gelu": ("a2",) * L, "fc2": ("k",) * L, "out": (None,) * L}
    ar = collective_time("all_reduce", 4 * 512 * 1024 * 2, 8, "intra", A100)
    times = {(p, c): edge_times(g.nodes[p], g.nodes[c].operands[i], st[p], st[c], mesh, A100, MEGATRON)
             for p, c, i in g.edges()}
    assert times[("x", "fc1")] == pytest.approx((0.0, ar))      # backward: dX of fc1 is Partial
    assert times[("fc1", "gelu")] == (0.0, 0.0)
    assert times[("gelu", "fc2")] == (0.0, 0.0)
    assert times[("fc2", "out")] == pytest.approx((ar, 0.0))    # forward: fc2 output is Partial
    # weights are sharded 8 ways, no gradient sync (TP only)
    nc = node_cost(g.nodes["fc1"], st["fc1"], mesh, A100, MEGATRON)
    assert nc.grad_sync_s == 0.0 and nc.param_bytes == pytest.approx(4096 * 1024 * 2 / 8)
    assert edge_cost(g, "fc2", "out", 0, st["fc2"], st["out"], mesh, A100, MEGATRON) == pytest.approx(ar)


def test_data_parallel_grad_sync_and_zero():
    g = mlp_graph(b=8, s=1024, h=1024)       # compute-bound at 1/8 of the batch
    mesh = Mesh.for_devices(A100, 8)
    dp = ("b0",) * 3
    w = 4096 * 1024
    nc = node_cost(g.nodes["fc1"], dp, mesh, A100, BF16)
    # per operator the bandwidth part of the ring all-reduce, 2(n-1)/n * B / beta (REFERENCE.md); the
    # latency 2(n-1) alpha is its bucket's, paid once per stage (costmodel.gradsync)
    bw = A100.intra_bw
    assert nc.grad_sync_s == pytest.approx(2 * 7 / 8 * 2 * w / bw)
    assert nc.state_bytes == pytest.approx(16 * w)
    z3 = node_cost(g.nodes["fc1"], dp, mesh, A100, CostSettings(zero=3, grad_sync_overlap=0.5))
    assert z3.state_bytes == pytest.approx(16 * w / 8)
    # each gather / the reduce-scatter also stages through flat buffers: read + write of the full
    # buffer and of the shard at the streaming bandwidth
    stage = 2 * (2 * w) * (1 + 1 / 8) / (2e12 * 0.8)
    assert staging_copy_time(2 * w, 8, A100) == pytest.approx(stage)
    assert staging_copy_time(2 * w, 1, A100) == 0.0
    assert z3.fwd_comm_s == pytest.approx(7 / 8 * 2 * w / bw + stage)
    assert z3.grad_sync_s == pytest.approx(0.5 * (7 / 8 * 2 * w / bw + stage))
    z1 = node_cost(g.nodes["fc1"], dp, mesh, A100, CostSettings(zero=1, grad_sync_overlap=0.0))
    z2 = node_cost(g.nodes["fc1"], dp, mesh, A100, CostSettings(zero=2, grad_sync_overlap=0.0))
    assert z2.grad_sync_s == pytest.approx(z1.grad_sync_s + 2 * stage)    # ZeRO-2 stages both collectives
    # compute divides by the split, replication duplicates it (on the plain roofline, where this
    # compute-bound GEMM's weight traffic hides; the preset's summed GEMM roofline adds the weight
    # read every replica pays: tests/test_kernel_efficiency.py)
    mx = A100.replace(gemm_memory_overlap=1.0)
    nc = node_cost(g.nodes["fc1"], dp, mesh, mx, BF16)
    rep = node_cost(g.nodes["fc1"], (None,) * 3, mesh, mx, BF16)
    assert nc.fwd_s == pytest.approx(rep.fwd_s / 8)
    assert rep.bwd_s == pytest.approx(2 * rep.fwd_s)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_gpt_layer_activation_bytes_match_megatron(t):
    s, b, h, a = 2048, 2, 4096, 32
    g = gpt_graph(layers=1, b=b, s=s, h=h, a=a, head=False)
    cl = Cluster(gpus_per_node=8)
    mesh = Mesh.for_devices(cl, t)
    st = megatron(g, len(mesh.levels))
    saved = sum(v[0] for v in saved_activations(g, st, mesh, MEGATRON).values())
    expect = s * b * h * (34 + 5 * a * s / h) if t == 1 else s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert saved == pytest.approx(expect, rel=0.05)
    cost = evaluate_sharding(g, st, mesh, cl, MEGATRON)
    assert cost.activation_bytes == pytest.approx(saved)
    if t > 1:
        # 2 all-reduces forward (after proj and fc2); backward 2 for the MLP/proj side plus q,k,v inputs
        ar = collective_time("all_reduce", s * b * h * 2, t, "intra", cl)
        fwd = sum(d["fwd_s"] - 0 for d in cost.per_node.values()) - sum(
            node_cost(n, st[n.name], mesh, cl, MEGATRON).fwd_s for n in g.nodes.values())
        assert fwd == pytest.approx(2 * ar)


def test_evaluate_blocks_sum_and_errors():
    g = gpt_graph(layers=2, b=2, s=128, h=256, a=4, vocab=1024)
    mesh = Mesh.for_devices(A100, 4)
    st = {n: ("b0",) * 2 if any(d.name == "b0" for d in node.dims) else ("a0",) * 2 if any(
        d.name == "a0" for d in node.dims) else (None, None) for n, node in g.nodes.items()}
    cost = evaluate_sharding(g, st, mesh, A100, BF16)
    assert set(cost.per_block) == {"layers.0", "layers.1"}
    assert cost.per_block["layers.0"]["time_s"] == pytest.approx(cost.per_block["layers.1"]["time_s"])
    assert sum(d["time_s"] for d in cost.per_node.values()) == pytest.approx(cost.step_time_s)
    assert cost.step_time_s == pytest.approx(cost.compute_s + cost.comm_s)
    assert cost.grad_sync_s > 0 and cost.reshard_s >= 0
    assert cost.param_bytes == pytest.approx(2 * g.param_count())      # pure DP: full replicas
    bad = dict(st)
    bad["embed"] = ("b0",)
    with pytest.raises(SappError):
        evaluate_sharding(g, bad, mesh, A100, BF16)
    del bad["embed"]
    with pytest.raises(SappError):
        evaluate_sharding(g, bad, mesh, A100, BF16)


def test_precision_reprices_floats_not_ids():
    g = gpt_graph(layers=1, b=2, s=64, h=128, a=4, vocab=512)
    mesh = Mesh.for_devices(A100, 1)
    st = {n: () for n in g.nodes}
    bf = saved_activations(g, st, mesh, MEGATRON)
    fp = saved_activations(g, st, mesh, CostSettings(precision="fp32"))
    for tid, (b, _) in bf.items():
        if tid.endswith(":mask"):
            assert fp[tid][0] == b                       # masks stay 1 byte
        elif tid == "ids" or tid.startswith("loss:in"):
            assert fp[tid][0] == b                       # int64 ids keep their width
        else:
            assert fp[tid][0] == pytest.approx(2 * b)
    c_bf = evaluate_sharding(g, st, mesh, A100, MEGATRON)
    c_fp = evaluate_sharding(g, st, mesh, A100, CostSettings(precision="fp32"))
    assert c_fp.param_bytes == pytest.approx(2 * c_bf.param_bytes)
    assert c_fp.state_bytes == pytest.approx(c_bf.state_bytes)        # 16 bytes/param either way


def test_measured_size_curves_price_small_ops_at_cache_speed():
    # a curve replaces bandwidth x efficiency: 6 MB moved streams at 60 GB/s, 600 MB at 15 GB/s
    c = A100.replace(op_overhead=0.0, mem_bw_curve=[[6e6, 60e9], [6e8, 15e9]], rng_curve=[[1e4, 2e8], [1e7, 5e7]])
    assert compute_time(1e3, 6e6, c) == pytest.approx(6e6 / 60e9)
    assert compute_time(1e3, 6e8, c) == pytest.approx(6e8 / 15e9)
    assert compute_time(1e3, 6e7, c) == pytest.approx(6e7 / 37.5e9)          # halfway on log(size)
    assert compute_time(0, 1e3, c, randoms=1e7) == pytest.approx(1e7 / 5e7)
    assert compute_time(0, 1e3, c, randoms=1e4) == pytest.approx(1e4 / 2e8)
    assert compute_time(1e12, 0, c) == pytest.approx(1e12 / (312e12 * 0.8))  # arithmetic unchanged


def test_views_cost_only_their_dispatch():
    from sapp.api import capture_graph, resolve_model
    g = capture_graph(resolve_model("gpt-tiny")[0])[0]
    mesh = Mesh((Level(1, "intra"),))
    views = [n for n in g.nodes.values() if n.kind == "view"]
    assert views
    serial = A100.replace(op_overhead=10e-6, async_launch=False)
    for v in views:
        nc = node_cost(v, (None,), mesh, serial, BF16)
        assert nc.fwd_s == pytest.approx(10e-6) and nc.bwd_s == pytest.approx(10e-6)
        assert node_cost(v, (None,), mesh, A100, BF16).compute_s == 0.0       # async: hidden entirely


def test_search_prices_the_clusters_precision():
    from sapp.api import search
    # dp pinned: the gradients cross the wire (a free search may replicate this dispatch-bound model
    # over tp=2 instead, which syncs no gradients at all)
    cpu = search("mlp-tiny", "cpu:gpus=2", global_batch=8, constraints={"dp": 2})
    assert cpu["settings"]["precision"] == "fp32"
    gpu = search("mlp-tiny", "a100-80g:gpus=2", global_batch=8)
    assert gpu["settings"]["precision"] == "bf16-mixed"
    forced = search("mlp-tiny", "cpu:gpus=2", global_batch=8, precision="bf16-mixed", constraints={"dp": 2})
    assert forced["settings"]["precision"] == "bf16-mixed"
    assert forced["predicted"]["comm_s"] < cpu["predicted"]["comm_s"]        # 2-byte gradients on the wire


def test_measured_op_rates_floor_non_gemm_ops():
    from sapp.api import capture_graph, resolve_model
    g = capture_graph(resolve_model("gpt-tiny")[0])[0]
    mesh = Mesh((Level(1, "intra"),))
    gelu = next(n for n in g.nodes.values() if n.target.startswith("aten.gelu"))
    mm = next(n for n in g.nodes.values() if n.kind == "matmul")
    base = A100.replace(op_overhead=0.0)
    slow = base.replace(op_rates={"gelu": [1e6, 5e5], "addmm": [1e3, 1e3]})   # the slowest rate a cluster admits
    c0, c1 = node_cost(gelu, (None,), mesh, base, BF16), node_cost(gelu, (None,), mesh, slow, BF16)
    assert c1.fwd_s == pytest.approx(gelu.out.numel / 1e6)        # the measured rate binds
    assert c1.bwd_s == pytest.approx(gelu.out.numel / 5e5)
    assert c0.fwd_s < c1.fwd_s / 100
    # GEMM-like ops keep the FLOP roofline even if a table names them
    assert node_cost(mm, (None,), mesh, slow, BF16).fwd_s == node_cost(mm, (None,), mesh, base, BF16).fwd_s


def test_compute_scale_multiplies_operator_time_not_communication():
    c = A100.replace(compute_scale=1.5)
    assert compute_time(1e12, 0, c) == pytest.approx(1.5 * 1e12 / (312e12 * 0.8))
    assert collective_time("all_reduce", 1e9, 8, "intra", c) == collective_time("all_reduce", 1e9, 8, "intra", A100)


def test_measured_collective_fits_replace_the_all_reduce_model_inside_a_node():
    c = A100.replace(collective_fits={"all_gather": [1e-3, 1e9]})
    assert collective_time("all_gather", 1e6, 2, "intra", c) == pytest.approx(1e-3 + 0.5 * 1e6 / 1e9)
    # other kinds and links keep the link's figures
    assert collective_time("reduce_scatter", 1e6, 2, "intra", c) == collective_time("reduce_scatter", 1e6, 2, "intra", A100)
    assert collective_time("all_gather", 1e6, 2, "inter", c) == collective_time("all_gather", 1e6, 2, "inter", A100)


def test_flat_allreduce_staging_on_a_serial_device():
    # ZeRO-0 on a CPU: gradients go through one flat buffer (in, divide, out: three read+write passes)
    # around the all-reduce, after backward has swept the caches: DRAM rate, so pricing the buffer a
    # unit at a time (small shares the size curve would put in cache) costs what pricing it whole does
    from sapp.costmodel.nodes import grad_sync_times
    from sapp.costmodel.primitives import collective_time, flat_allreduce_staging_time
    cpu = Cluster.parse("cpu:gpus=2").replace(mem_bw_curve=((1e6, 1e11), (1e9, 1e10)))
    gb = 16e6
    stage = flat_allreduce_staging_time(gb, cpu)
    assert stage == pytest.approx(6 * gb / (cpu.mem_bandwidth * cpu.memory_efficiency))
    assert sum(flat_allreduce_staging_time(gb / 16, cpu) for _ in range(16)) == pytest.approx(stage)
    from sapp.cluster import curve_rate
    assert stage > 3 * 6 * (gb / 16) * 16 / curve_rate(cpu.mem_bw_curve, 2 * gb / 16, 0.0)
    sync, gather = grad_sync_times(gb, gb, 2, "intra", cpu, 0)
    assert sync == pytest.approx(collective_time("all_reduce", gb, 2, "intra", cpu) + stage) and gather == 0.0
    assert grad_sync_times(gb, gb, 2, "intra", A100, 0)[0] == pytest.approx(collective_time("all_reduce", gb, 2, "intra", A100))
    assert flat_allreduce_staging_time(0.0, cpu) == 0.0


def test_loss_allreduce_is_a_latency_tree_and_part_of_the_step():
    # a scalar all-reduce is latency-bound and runs as a tree: log2(n) hops, not the ring's 2(n-1)
    from sapp.costmodel.primitives import scalar_allreduce_time, collective_time as ring
    from sapp.costmodel.primitives import link_params
    cl = Cluster.parse("a100-80g:nodes=64")
    alpha = link_params("inter", cl)[0]
    assert scalar_allreduce_time(1, "inter", cl) == 0.0
    assert scalar_allreduce_time(512, "inter", cl) == pytest.approx(9 * alpha)
    assert scalar_allreduce_time(512, "inter", cl) < ring("all_reduce", 4.0, 512, "inter", cl) / 50
    # the searched step carries it as its own communication kind
    import sapp
    plan = sapp.search(sapp.models.get("gpt-small", device="meta"), Cluster.parse("cpu:gpus=2"), global_batch=8)
    by = plan.predicted["comm_by_kind"]
    assert by["loss_sync"] == pytest.approx(scalar_allreduce_time(2, "intra", Cluster.parse("cpu:gpus=2")), rel=1e-4)
    assert by["loss_sync"] > 0 and plan.predicted["comm_s"] == pytest.approx(sum(by.values()), rel=1e-4)
