import pytest

from sapp import Cluster
from sapp.costmodel import CostSettings
from sapp.costmodel.optimizer import optimizer_step_time, update_bytes_per_param


def test_adam_update_is_memory_bound_28_bytes_per_param():
    c = Cluster.parse("a100-80g:nodes=1")
    s = CostSettings()
    assert update_bytes_per_param(s) == 28
    assert update_bytes_per_param(CostSettings(precision="fp32")) == 28
    n = 1e9                                              # 1B params, states held locally (12 B each)
    t = optimizer_step_time(12 * n, 2 * n, c, s)
    assert t == pytest.approx(28e9 / (2.0e12 * 0.8))
    # ZeRO-1 over 8: the state held (and so the update) shrinks 8x
    assert optimizer_step_time(12 * n / 8, 2 * n, c, s) == pytest.approx(t / 8)


def test_joint_search_charges_the_update_and_zero_shrinks_it():
    from sapp.api import search
    import sapp.models as models
    # dense tables (sparse=False): a sparse-gradient table runs outside ZeRO (emit.sparse), whole on
    # every rank, so only dense parameters show ZeRO-1 halving the update
    dense = search(models.get("wide-deep-1m", device="meta", sparse=False), "a100-80g:nodes=1,gpus=2", global_batch=4096,
                   constraints={"dp": 2, "zero": 0})
    z1 = search(models.get("wide-deep-1m", device="meta", sparse=False), "a100-80g:nodes=1,gpus=2", global_batch=4096,
                constraints={"dp": 2, "zero": 1})
    o0, o1 = dense.predicted["optimizer_s"], z1.predicted["optimizer_s"]
    # 84M parameters x 28 B at 1.6 TB/s ~ 1.5 ms; ZeRO-1 over 2 halves it
    assert 1e-3 < o0 < 2e-3 and o1 == pytest.approx(o0 / 2, rel=0.02)
    assert dense.predicted["compute_s"] >= o0


def test_update_dispatch_per_tensor_on_cpu_per_op_on_gpu():
    from sapp.costmodel.optimizer import optimizer_dispatch_time
    # hand figures, not the module's constants: fused Adam dispatches 2 ops per tensor; torch's
    # single-tensor SGD loop 3 per tensor; an Adam step on DTensors 7 (AdamW 8: + the weight decay)
    FUSED_OPS_PER_TENSOR, UPDATE_OPS = 2, {"adam": 7, "adamw": 8, "sgd": 3}
    s = CostSettings(precision="fp32")
    n = 1e6
    cpu = Cluster.parse("cpu").replace(op_overhead=10e-6, sharded_op_overhead=80e-6)
    traffic = n * 28 / (cpu.mem_bandwidth * cpu.memory_efficiency)
    # serial (CPU eager), plain parameters: emit's fused Adam, a couple of dispatches per tensor,
    # added to the traffic
    assert optimizer_step_time(8 * n, 4 * n, cpu, s, tensors=50) == pytest.approx(
        traffic + 50 * FUSED_OPS_PER_TENSOR * 10e-6)
    # an optimizer emit does not fuse: torch's single-tensor loop, its ops per tensor
    sgd = CostSettings(precision="fp32", optimizer="sgd")
    assert optimizer_dispatch_time(50, cpu, sgd) == pytest.approx(50 * UPDATE_OPS["sgd"] * 10e-6)
    # the update's own per-op figure (a bare dispatch) wins over the graph's when calibrated
    assert optimizer_dispatch_time(50, cpu.replace(update_op_overhead=4e-6), s) == pytest.approx(
        50 * FUSED_OPS_PER_TENSOR * 4e-6)
    # sharded (DTensor) parameters dispatch through the subclass: its own per-op figure
    assert optimizer_step_time(8 * n, 4 * n, cpu, s, tensors=50, sharded=True) == pytest.approx(
        traffic + 50 * 7 * 80e-6)
    assert optimizer_step_time(8 * n, 4 * n, cpu.replace(sharded_op_overhead=0.0), s, tensors=50, sharded=True) \
        == pytest.approx(traffic + 50 * 7 * 10e-6)                    # unset: the plain figure
    assert optimizer_step_time(8 * n, 4 * n, cpu, s) == pytest.approx(traffic)   # no tensor count given
    # asynchronous (GPU): one foreach op per update op for all tensors, hidden behind the traffic
    gpu = Cluster.parse("a100-80g")
    assert optimizer_dispatch_time(50, gpu, s) == pytest.approx(UPDATE_OPS["adam"] * gpu.op_overhead)
    assert optimizer_step_time(8 * n, 4 * n, gpu, s, tensors=50) == pytest.approx(
        max(n * 28 / (2e12 * 0.8), 7 * gpu.op_overhead))
    assert UPDATE_OPS["adamw"] == UPDATE_OPS["adam"] + 1


def test_joint_search_charges_update_dispatch_per_tensor_and_sharded_rate():
    # On a serial (CPU) cluster the update dispatches each parameter tensor's ops; under ZeRO-3 the
    # parameters are sharded DTensors and pay the sharded per-op figure.
    from sapp.api import resolve_model, search
    FUSED_OPS_PER_TENSOR, ADAM_OPS = 2, 7   # fused Adam per tensor; the per-op loop on DTensors (hand figures)
    model = resolve_model("mlp")[0]
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    spec = "cpu:gpus=2,op_overhead=10us,sharded_op_overhead=1ms"
    pins = {"dp": 2, "tp": 1, "pp": 1}
    z0 = search("mlp", spec, global_batch=64, constraints=dict(pins, zero=0))
    z3 = search("mlp", spec, global_batch=64, constraints=dict(pins, zero=3))
    no_dispatch = search("mlp", "cpu:gpus=2,op_overhead=0", global_batch=64, constraints=dict(pins, zero=0))
    o0, o3 = z0.predicted["optimizer_s"], z3.predicted["optimizer_s"]
    assert o0 - no_dispatch.predicted["optimizer_s"] == pytest.approx(tensors * FUSED_OPS_PER_TENSOR * 10e-6, rel=1e-6)
    assert o3 > tensors * ADAM_OPS * 1e-3


def test_update_streams_from_dram_whatever_the_tensor_sizes():
    # the caches are swept by forward and backward between two updates: many small tensors update at
    # the DRAM rate like one big one, not at the cache rate the size curve gives small tensors
    s = CostSettings(precision="fp32")
    cpu = Cluster.parse("cpu").replace(op_overhead=0.0, update_op_overhead=0.0,
                                       mem_bw_curve=((1e6, 1e11), (1e9, 1e10)))
    n = 1e7                                              # 280 MB of update traffic
    one = optimizer_step_time(8 * n, 4 * n, cpu, s, tensors=1)
    many = optimizer_step_time(8 * n, 4 * n, cpu, s, tensors=280)     # 1 MB per tensor
    dram = cpu.mem_bandwidth * cpu.memory_efficiency
    assert one == pytest.approx(28 * n / dram)
    assert many == pytest.approx(one)
    assert many > 28 * n / curve_at(cpu, 1e6) * 2      # far slower than the cache rate


def curve_at(cluster, nbytes):
    from sapp.cluster import curve_rate
    return curve_rate(cluster.mem_bw_curve, nbytes, 0.0)
