import json

import pytest

from sapp import Cluster, ClusterError
from sapp.cluster import PRESETS
from sapp.cluster.mesh import Mesh, prime_factors
from sapp.units import parse_quantity


def test_presets_match_reference_data_sheets():
    a100 = PRESETS["a100-80g"]
    assert a100.peak_flops == 312e12 and a100.device_memory == 80e9 and a100.intra_bw == 300e9
    assert a100.inter_bw == pytest.approx(8 * 200e9 / 8 / 8)  # 8 x 200 Gb/s per node over 8 GPUs
    assert PRESETS["h100-80g"].peak_flops == 989e12 and PRESETS["h200"].device_memory == 141e9
    assert PRESETS["v100-32g"].inter_bw == pytest.approx(4 * 100e9 / 8 / 8)
    for c in PRESETS.values():
        c.validate()


def test_parse_spec_nodes_and_overrides():
    c = Cluster.parse("a100-80g:nodes=128")
    assert c.devices == 1024 and c.gpus_per_node == 8
    c = Cluster.parse("h100-80g:nodes=2,gpus=4,inter_bw=400Gb/s,intra_latency=3us,memory=40GB")
    assert (c.nodes, c.gpus_per_node, c.devices) == (2, 4, 8)
    assert c.inter_bw == pytest.approx(50e9) and c.intra_latency == pytest.approx(3e-6)
    assert c.device_memory == 40e9
    assert Cluster.parse("a100-80g:devices=64").nodes == 8
    assert Cluster.parse("a100-80g:devices=4").devices == 4


@pytest.mark.parametrize("spec, needle", [
    ("tpu-v9:nodes=2", "unknown cluster preset"),
    ("a100-80g:nodes=0", "nodes must be a positive"),
    ("a100-80g:nodes=-3", "nodes must be a positive"),
    ("a100-80g:nodes=2.5", "whole number"),
    ("a100-80g:devices=12", "not a multiple of 8"),
    ("a100-80g:nodes=2,devices=24", "not nodes x gpus"),
    ("a100-80g:peak_flops=0", "peak_flops must be a positive"),
    ("a100-80g:warp=9", "unknown cluster key"),
    ("a100-80g:nodes", "needs key=value"),
    ("a100-80g:intra_bw=fast", "cannot read intra_bw"),
    ("", "empty cluster spec"),
    ("cpu:async_launch=maybe", "async_launch must be true or false"),
])
def test_bad_specs_give_one_line_errors(spec, needle):
    with pytest.raises(ClusterError) as e:
        Cluster.parse(spec)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_json_roundtrip_and_bad_files(tmp_path):
    c = Cluster.parse("v100-32g:nodes=4")
    p = tmp_path / "c.json"
    c.save(p)
    assert Cluster.load(p) == c
    assert Cluster.parse(str(p)) == c
    d = c.to_dict()
    d["gpus_per_node"] = 0
    p.write_text(json.dumps(d))
    with pytest.raises(ClusterError, match="gpus_per_node must be"):
        Cluster.load(p)
    p.write_text("{not json")
    with pytest.raises(ClusterError, match="not valid JSON"):
        Cluster.load(p)
    p.write_text(json.dumps({"nodes": 1, "bogus": 3}))
    with pytest.raises(ClusterError, match="unknown cluster field"):
        Cluster.load(p)


def test_op_overhead_presets_and_parsing(tmp_path):
    # GPUs: a few microseconds per launch, hidden behind the device (async); the CPU preset: larger
    # and serial (the dispatching thread computes too).
    for name in ("a100-80g", "h100-80g", "h200", "v100-32g"):
        c = PRESETS[name]
        assert 1e-6 <= c.op_overhead <= 10e-6 and c.async_launch is True
    cpu = PRESETS["cpu"]
    assert cpu.op_overhead > PRESETS["a100-80g"].op_overhead and cpu.async_launch is False
    # random draws: never the limit on GPUs (faster than HBM streams 4-byte elements), ~1e8/s on a core
    assert all(PRESETS[n].rng_rate > PRESETS[n].mem_bandwidth / 4 for n in ("a100-80g", "h100-80g", "h200"))
    assert cpu.rng_rate < 1e9
    c = Cluster.parse("a100-80g:op_overhead=7us,async_launch=false")
    assert c.op_overhead == pytest.approx(7e-6) and c.async_launch is False
    p = tmp_path / "c.json"
    c.save(p)
    assert Cluster.load(p) == c and Cluster.load(p).async_launch is False
    d = c.to_dict()
    del d["op_overhead"], d["async_launch"]          # files written before the fields existed
    assert Cluster.from_dict(d).op_overhead == Cluster().op_overhead
    with pytest.raises(ClusterError, match="async_launch must be true or false"):
        Cluster(async_launch=1).validate()
    with pytest.raises(ClusterError, match="op_overhead must be >= 0"):
        Cluster.from_dict(dict(d, op_overhead=-1e-6))


def test_units():
    assert parse_quantity("80GB") == 80e9
    assert parse_quantity("200Gb/s") == 25e9
    assert parse_quantity("1.5GiB") == 1.5 * 2**30
    assert parse_quantity("5us") == pytest.approx(5e-6)
    assert parse_quantity("312T") == 312e12


def test_mesh_levels_follow_topology():
    c = Cluster.parse("a100-80g:nodes=128")
    m = Mesh.for_devices(c, 1024)
    assert m.size == 1024
    assert [lv.link for lv in m.levels] == ["inter"] * 7 + ["intra"] * 3
    m6 = Mesh.for_devices(Cluster.parse("a100-80g:nodes=1,gpus=6"), 6)
    assert [lv.size for lv in m6.levels] == [3, 2]          # k-way cuts for any factor
    assert prime_factors(360) == [5, 3, 3, 2, 2, 2]
    with pytest.raises(Exception, match="whole nodes"):
        Mesh.for_devices(c, 12)


def test_memory_headroom_limits_usable_memory():
    c = Cluster.parse("a100-80g:nodes=1")
    assert c.usable_memory == pytest.approx(0.97 * 80e9)
    assert Cluster.parse("a100-80g:memory_headroom=0").usable_memory == 80e9
    with pytest.raises(ClusterError, match="memory_headroom"):
        Cluster.parse("a100-80g:memory_headroom=0.95")


def test_size_curves_validate_interpolate_and_roundtrip(tmp_path):
    from sapp.cluster import curve_rate
    c = Cluster.parse("cpu").replace(mem_bw_curve=[[1e5, 6e10], [1e7, 6e10], [1e9, 2e10]])
    assert c.mem_bw_curve == ((1e5, 6e10), (1e7, 6e10), (1e9, 2e10))
    assert curve_rate(c.mem_bw_curve, 1e3, 0) == 6e10          # below the first point: its rate
    assert curve_rate(c.mem_bw_curve, 1e12, 0) == 2e10         # beyond the last: its rate
    assert curve_rate(c.mem_bw_curve, 1e8, 0) == pytest.approx(4e10)   # halfway on log(size)
    assert curve_rate((), 5.0, 7.0) == 7.0
    path = tmp_path / "c.json"
    c.save(path)
    assert Cluster.load(path) == c
    for bad in ([[1e5, 6e10], [1e4, 5e10]], [[1e5, -1]], [[1e5]], "fast"):
        with pytest.raises(ClusterError, match="mem_bw_curve"):
            Cluster.from_dict({**Cluster.parse("cpu").to_dict(), "mem_bw_curve": bad})
    with pytest.raises(ClusterError, match="json"):
        Cluster.parse("cpu:mem_bw_curve=1")


def test_precision_is_a_cluster_default():
    assert Cluster.parse("cpu").precision == "fp32"
    assert Cluster.parse("a100-80g").precision == "bf16-mixed"
    assert Cluster.parse("a100-80g:precision=fp32").precision == "fp32"
    with pytest.raises(ClusterError, match="precision"):
        Cluster.parse("cpu:precision=fp8")
