"""FSDP2's copies around its collectives under the torchtitan profiles (costmodel/torchtitan.py
fsdp_copy_bytes, costmodel/gradsync.fsdp_exposed_copies): the bytes each copy moves scale as torch's
_fsdp_collectives.py code says, the copies on the compute stream are part of a unit's compute (never
hidden by FSDP2's prefetch), and no other runtime prices them.  On llama-tiny."""
from types import SimpleNamespace

import pytest

from sapp import api
from sapp.cluster import PRESETS
from sapp.costmodel import CostSettings
from sapp.costmodel.gradsync import fsdp_exposed_copies, param_sync
from sapp.costmodel.primitives import staging_copy_time
from sapp.costmodel.torchtitan import fsdp_copy_bytes, fsdp_held_ratio
from sapp.pipeline.profile import build_profile
from sapp.search.joint.numbers import _unit_gather

TT = CostSettings(runtime="torchtitan", zero=3)
CL = PRESETS["h100-80g"]


def _like(settings, **over):
    """`settings`' widths with some replaced (a reduce dtype the profile does not offer)."""
    d = {k: getattr(settings, k) for k in ("torchtitan", "weight_bytes", "reduce_bytes")}
    d.update(over)
    return SimpleNamespace(**d)


def test_copy_bytes_scale_as_the_code_says():
    for numel in (1e6, 3e6):
        for n in (2, 8):
            got = fsdp_copy_bytes(numel, n, TT)
            # copy-in: this rank's fp32 shard cast to bf16, then copied into the all-gather input: 1/n
            assert got["gather_in"] * n == pytest.approx(fsdp_copy_bytes(numel, 1e9, TT)["gather_in"] * 1e9)
            assert got["gather_in"] == pytest.approx(numel / n * ((4 + 2) + (2 + 2)))
            # copy-out and the reduce-scatter copy-in touch every unsharded element, whatever n
            assert got["copy_out"] == 2 * 2 * numel
            assert got["rs_in"] == numel * (2 + 4)
            assert got["rs_out"] == 0           # fp32 reduce into the fp32 sharded gradient: a view
    n, numel = 8, 1e6
    fp32, bf16 = fsdp_copy_bytes(numel, n, TT), fsdp_copy_bytes(numel, n, _like(TT, reduce_bytes=2))
    # the reduce-scatter input written in fp32 is twice the bytes of a bf16 one; the bf16 reads the same
    assert fp32["rs_in"] - numel * 2 == 2 * (bf16["rs_in"] - numel * 2)
    assert bf16["rs_out"] == numel / n * (2 + 4)        # a bf16 reduce output cast to the fp32 gradient
    # full precision: no cast before the all-gather, every copy at 4 bytes
    full = fsdp_copy_bytes(numel, n, _like(TT, weight_bytes=4))
    assert full["gather_in"] == numel / n * (4 + 4) and full["copy_out"] == numel * 8
    assert fsdp_copy_bytes(numel, 1, TT) == {} and fsdp_copy_bytes(numel, n, CostSettings(zero=3)) == {}
    assert fsdp_held_ratio(TT) == 3.0 and fsdp_held_ratio(CostSettings(zero=3)) == 0.0


def test_exposed_and_overlapped_copies():
    numel, n = 4e6, 8
    params = [(numel, n, "intra", True, None), (numel, 1, "intra", True, None), (numel, n, "intra", False, None)]
    rate = CL.mem_bandwidth * CL.memory_efficiency
    b = fsdp_copy_bytes(numel, n, TT)
    # ZeRO-3: the copy-out in every forward and backward (as the gathers are priced), the
    # reduce-scatter copy-in once a step with the gradient sync
    assert fsdp_exposed_copies(params, CL, TT) == pytest.approx(
        (b["copy_out"] / rate, b["copy_out"] / rate, b["rs_in"] / rate))
    # ZeRO-2 gathers once a step; below it FSDP2 runs no copies; another runtime prices none here
    z2 = CostSettings(runtime="torchtitan", zero=2)
    assert fsdp_exposed_copies(params, CL, z2) == pytest.approx((0.0, 0.0, (b["copy_out"] + b["rs_in"]) / rate))
    assert fsdp_exposed_copies(params, CL, CostSettings(runtime="torchtitan", zero=0)) == (0.0, 0.0, 0.0)
    assert fsdp_exposed_copies(params, CL, CostSettings(zero=3)) == (0.0, 0.0, 0.0)
    # the overlapped copy-in goes with the gather it feeds, in place of the generic flat-buffer staging
    eager = CostSettings(zero=3, grad_fp32=True)      # the same 2-byte weights and 4-byte reduce
    (s_tt, g_tt), (s_e, g_e) = param_sync(numel, n, "intra", CL, TT), param_sync(numel, n, "intra", CL, eager)
    assert g_tt - g_e == pytest.approx(b["gather_in"] / rate - staging_copy_time(numel * 2, n, CL))
    assert s_tt - s_e == pytest.approx(-staging_copy_time(numel * 4, n, CL))


@pytest.fixture(scope="module")
def tiny():
    return api.capture_graph(api.resolve_model("llama-tiny")[0])[0]


def test_prefetch_never_hides_the_exposed_copies(tiny):
    cl = api.resolve_cluster("h100-80g:nodes=1")
    prof = build_profile(tiny, cl, CostSettings(runtime="torchtitan"), 8, 1)
    plain = build_profile(tiny, cl, CostSettings(), 8, 1)
    cfg = SimpleNamespace(mbs=1, cp=1)
    blocks = [u for u in prof.units if u.kind == "block"]
    assert blocks
    for u in blocks:
        c3, c2 = u.zcopy[3], u.zcopy[2]
        assert c3[0] > 0 and c3[1] == c3[0] and c3[2] > c3[0] and u.zcopy[0] == (0.0, 0.0, 0.0)
        assert c2[:2] == (0.0, 0.0) and c2[2] == pytest.approx(c3[0] + c3[2])
        (f3, b3), (f0, b0) = u.fb_at(1, 3), u.fb_at(1, 0)
        # the ZeRO-3 curve carries the copies; the gathers the prefetch may hide do not
        assert _unit_gather(u, cfg) == pytest.approx((f3 - f0 - c3[0], b3 - b0 - c3[1]))
    assert all(v == (0.0, 0.0, 0.0) for u in plain.units for v in u.zcopy.values())


def test_step_time_carries_the_once_a_step_copies(tiny, monkeypatch):
    # the same imported plan under the torchtitan profile: its reported gradient sync holds the
    # reduce-scatter copy-ins of every unit, never overlapped (search/joint/evaluate.step_copies)
    from sapp.engines import import_config
    cl = api.resolve_cluster("h100-80g:nodes=1")
    toml = ("[parallelism]\ndata_parallel_shard_degree = -1\n[training]\nlocal_batch_size = 2\nseq_len = 32\n"
            '[activation_checkpoint]\nmode = "none"\n')
    plan = import_config(toml, "torchtitan@0.2.2", tiny, cl, "llama-tiny")["predicted"]
    prof = build_profile(tiny, cl, CostSettings(runtime="torchtitan"), 8, 1)
    steps = sum(u.zcopy[3][2] for u in prof.units)
    import sapp.search.joint.evaluate as ev
    monkeypatch.setattr(ev, "step_copies", lambda *a: 0.0)
    without = import_config(toml, "torchtitan@0.2.2", tiny, cl, "llama-tiny")["predicted"]
    assert steps > 0
    assert plan["grad_sync_s"] - without["grad_sync_s"] == pytest.approx(steps, rel=1e-3)
    assert plan["step_time_s"] - without["step_time_s"] == pytest.approx(steps, rel=1e-3)
