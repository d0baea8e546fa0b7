"""Stage profiles: ZeRO stages derived from the zero-0 evaluation equal a direct cost-model
evaluation; the affine micro-batch fit reproduces an evaluation at another batch; units."""
import pytest

from sapp.cluster import Cluster
from sapp.costmodel import CostSettings
from sapp.pipeline import profile as P
from bench.random_graphs import gpt_graph


@pytest.fixture(scope="module")
def prof():
    g = gpt_graph(layers=4, b=2, s=256, h=512, a=8, vocab=4096)
    cl = Cluster.parse("a100-80g:nodes=2")
    return g, cl, P.build_profile(g, cl, CostSettings(), 8, 2)


def test_units_follow_blocks(prof):
    g, _, p = prof
    names = [u.name for u in p.units]
    assert names == ["prologue", "layers.0", "layers.1", "layers.2", "layers.3", "epilogue"]
    assert all(u.rep == "layers.0" for u in p.units if u.kind == "block")
    assert sum(len(u.nodes) for u in p.units) == len(g.nodes)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_stages_follow_the_published_formulas(zero):
    """A block's model states per device under ZeRO over dp = 8 (no tensor parallelism), bf16-mixed
    Adam: REFERENCE.md / the ZeRO paper, Psi the block's parameters, K = 12 (fp32 master + moments):
    ZeRO-0 (2 + 2 + K) Psi, ZeRO-1 4 Psi + K Psi/d, ZeRO-2 2 Psi + (2 + K) Psi/d, ZeRO-3 (2 + 2 + K) Psi/d.
    ZeRO-3 gathers the weights before forward and backward: each pass gets 7/8 of the bf16 weights
    over NVLink on top of ZeRO-0's."""
    g = gpt_graph(layers=4, b=2, s=256, h=512, a=8, vocab=4096)
    cl = Cluster.parse("a100-80g:nodes=1")
    p = P.build_profile(g, cl, CostSettings(), 8, 1)
    blk = p.units[1]
    psi = sum(x.numel for n, x in g.params.items() if n.startswith("layers.0."))
    want = {0: 16 * psi, 1: 4 * psi + 12 * psi / 8, 2: 2 * psi + 14 * psi / 8, 3: 16 * psi / 8}[zero]
    assert sum(blk.states[zero].values()) == pytest.approx(want, rel=1e-9)
    gathered = blk.at(1, zero)[0] - blk.at(1, 0)[0]
    if zero == 3:
        wb = 2 * psi
        stage = 2 * wb * (1 + 1 / 8) / (cl.mem_bandwidth * cl.memory_efficiency)   # flat-buffer copies
        assert gathered == pytest.approx(7 * cl.intra_latency + 7 / 8 * wb / cl.intra_bw + stage, rel=1e-6)
    else:
        assert gathered == pytest.approx(0.0, abs=1e-15)


def test_affine_fit_reproduces_another_micro_batch(prof):
    # Time is convex piecewise-linear in the micro-batch (roofline, and on GPUs small ops are
    # launch-bound: max(roofline, launch)), so the profile samples it up to the largest micro-batch
    # the search may use: exact at a sample, the secant (an upper bound, within 2 %) in between.
    g, cl, _ = prof
    p = P.build_profile(g, cl, CostSettings(), 8, 2, max_mbs=4)
    blk = p.units[1]
    for mb, rel in ((4, 1e-9), (3, 0.02)):
        d = P._unit_numbers(p.template.rebatch(8 * mb), p.units, p.strategies, p.mesh, cl, CostSettings(), 0, 8)
        f, b, act, extra, out = blk.at(mb, 0)
        assert f == pytest.approx(d["layers.0"]["fwd"], rel=rel) and f >= d["layers.0"]["fwd"] * (1 - 1e-9)
        assert act[0] == pytest.approx(d["layers.0"]["act"][0], rel=1e-9)


def test_stage_mesh_roles():
    cl = Cluster.parse("a100-80g:nodes=4")
    mesh, roles = P.stage_mesh(cl, 8, 4)
    assert [(lv.size, lv.link) for lv in mesh.levels] == [(8, "inter"), (4, "intra")] and roles == ("dp", "tp")
    mesh, roles = P.stage_mesh(cl, 2, 2)
    assert [(lv.size, lv.link) for lv in mesh.levels] == [(2, "intra"), (2, "intra")]
    assert P.stage_mesh(cl, 1, 16) == (None, None)
    assert P.stage_mesh(cl, 3, 1) == (None, None)


def test_time_fit_follows_the_roofline_to_large_micro_batches():
    """A weight-bound MLP turns compute-bound as the micro-batch grows: the sampled convex fit must
    reproduce a direct evaluation far from b = 1, 2 (a 2-point affine fit is off several-fold)."""
    import sapp.models as M
    from sapp.capture import capture
    g = capture(M.get("mlp"), batch=8)
    cl = Cluster.parse("cpu:gpus=2")
    p = P.build_profile(g, cl, CostSettings(), 2, 1, max_mbs=512)
    for b in (1, 7, 64, 300, 512):
        d = P._unit_numbers(P.rebatch(p.template, 2 * b), p.units, p.strategies, p.mesh, cl, CostSettings(), 0, 2,
                            acts=False)
        got = sum(u.at(b, 0)[0] + u.at(b, 0)[1] for u in p.units if u.name in d)
        want = sum(x["fwd"] + x["bwd"] for x in d.values())
        assert got == pytest.approx(want, rel=0.15)
        if b in (1, 64, 512):           # sample points are exact
            assert got == pytest.approx(want, rel=1e-6)


def test_tensor_parallel_resharding_is_reported_as_communication():
    from sapp.api import search
    p = search("gpt3-1.3b", "a100-80g:nodes=1", global_batch=64, constraints={"tp": 8, "pp": 1})
    by = p.predicted["comm_by_kind"]
    assert by["reshard"] > 0 and by["pp_p2p"] == 0
    assert p.predicted["comm_s"] == pytest.approx(sum(by.values()), rel=1e-5)
    q = search("gpt3-1.3b", "a100-80g:nodes=1", global_batch=64, constraints={"tp": 1, "dp": 8})
    # pure data parallelism reshards only around the few ops without a batch dim
    assert q.predicted["comm_by_kind"]["reshard"] < 0.05 * by["reshard"]


def test_sparse_embedding_gradients_sync_only_touched_rows():
    """nn.Embedding(sparse=True) under data parallelism: the step's gradient holds the touched rows,
    so its sync is an all-gather of (rows, indices) per rank - never more than the dense all-reduce."""
    cl = Cluster.parse("a100-80g:nodes=2")
    st = CostSettings()
    rows, dim, samples, lookups = 1_000_000, 80, 64, 26
    sparse = (lookups * dim, lookups)            # elements, rows per sample per rank
    t = P.sparse_sync_time(rows * dim, 16, "inter", sparse, samples, cl, st)
    local = samples * (lookups * dim * 2 + lookups * 8)
    assert t == pytest.approx(15 * cl.inter_latency + 15 * local / cl.inter_bw)
    dense = P.collective_time("all_reduce", rows * dim * 2, 16, "inter", cl)
    assert t < dense / 20
    # a step that touches more than the table is capped at the dense all-reduce
    assert P.sparse_sync_time(1000 * dim, 16, "inter", sparse, samples, cl, st) == pytest.approx(
        P.collective_time("all_reduce", 1000 * dim * 2, 16, "inter", cl))
    # in a searched Wide&Deep plan the table's sync no longer dominates pure data parallelism
    from sapp.api import search
    p = search("wide-deep", "a100-80g:devices=8", global_batch=16384, constraints={"dp": 8})
    table = 26_000_000 * 80
    assert p.predicted["comm_by_kind"]["dp_grad_sync"] < P.collective_time("all_reduce", table * 2, 8, "intra", cl) / 10


def test_fsdp_unit_overhead_charged_per_sharded_unit_on_serial_devices():
    from sapp.api import search
    base = "cpu:gpus=2"
    pins = {"dp": 2, "tp": 1, "pp": 1, "zero": 3, "recompute": "none"}
    p0 = search("gpt-tiny", base, global_batch=8, constraints=pins)
    p1 = search("gpt-tiny", base + ",fsdp_unit_overhead=0.01", global_batch=8, constraints=pins)
    extra = p1["predicted"]["step_time_s"] - p0["predicted"]["step_time_s"]
    # at least one unit per block (gpt-tiny has 2) pays 10 ms, and only ZeRO-2/3 plans do
    assert extra >= 0.02 - 1e-6
    dp = dict(pins, zero=0)
    assert (search("gpt-tiny", base + ",fsdp_unit_overhead=0.01", global_batch=8, constraints=dp)["predicted"]["step_time_s"]
            == search("gpt-tiny", base, global_batch=8, constraints=dp)["predicted"]["step_time_s"])
    # and per parameter tensor: a gpt-tiny block holds 12 (2 norms, 4 linears, weights and biases)
    p2 = search("gpt-tiny", base + ",fsdp_tensor_overhead=0.001", global_batch=8, constraints=pins)
    assert p2["predicted"]["step_time_s"] - p0["predicted"]["step_time_s"] >= 2 * 12 * 0.001 - 1e-6
