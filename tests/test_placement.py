"""Host placement cost model and decisions (sapp/placement).  Unit tests on hand-built graphs; the
decision tests capture zoo models on the meta device (no memory, ~1-3 s each, cached per module)."""
import dataclasses
import json

import pytest

from sapp.cluster import Cluster
from sapp.costmodel import CostSettings
from sapp.errors import ConstraintError, InfeasibleError, PlanError
from sapp.placement import (choose, embedding_host_cost, host_infeasible_error, optimizer_offload_cost,
                            placement_options, require_host_memory, resolve, validate_section)
from sapp.placement.cost import Table
from sapp.plan import _round
from bench.random_graphs import GraphBuilder

S = CostSettings()
A100 = Cluster.parse("a100-80g:devices=1")


def wd_graph(rows=1000, dim=8, fields=4, dense=3, b=64, deep=(16, 8)):
    g = GraphBuilder("wd-hand")
    g.add("ids", "input", [("a0", b, True, True), ("a1", fields, True, False)], [("ids", None, ("a0", "a1"))],
          ("a0", "a1"), flops=0, out_dtype="int64")
    for t, d in (("wide_emb", 1), ("deep_emb", dim)):
        g.add(t, "embedding", [("b0", b, True, True), ("b1", fields, True, False), ("v", rows, True, False),
                               ("h", d, True, False)],
              [("act", "ids", ("b0", "b1")), ("param", t + ".weight", ("v", "h"))], ("b0", "b1", "h"), flops=0, module=t)
    din, prev = fields * dim, "deep_emb"
    for i, w in enumerate(list(deep) + [1]):
        g.add(f"deep.{i}", "matmul", [("b0", b, True, True), ("n", w, True, False), ("k", din, True, False)],
              [("act", prev, ("b0", "k")), ("param", f"deep.{i}.weight", ("n", "k"))], ("b0", "n"),
              flops=2 * b * din * w, module=f"deep.{i}", saves=("in0",))
        prev, din = f"deep.{i}", w
    gr = g.graph(outputs=(prev,), batch=b)
    for t in ("wide_emb.weight", "deep_emb.weight"):
        gr.params[t] = dataclasses.replace(gr.params[t], sparse_grad=True)
    return gr


def opts_of(graph, cluster=A100, **kw):
    return {o.name: o for o in placement_options(graph, list(graph.nodes), cluster, S, **kw)}


# ---- options, sections, pins -----------------------------------------------------------------
def test_options_device_first_and_sections():
    g = wd_graph()
    opts = placement_options(g, list(g.nodes), A100, S, compute_s=0.01)
    assert [o.name for o in opts] == ["device", "embedding-host", "optimizer-host", "embedding+optimizer-host"]
    dev, emb, off, both = opts
    assert dev.device_bytes_saved == 0 and dev.extra_time_s == 0 and dev.section["groups"] == {}
    assert emb.section["groups"] == {
        "deep_emb.weight": {"weights": "host", "grads": "host", "optimizer": "host", "optimizer_kind": "sparse_adam"},
        "wide_emb.weight": {"weights": "host", "grads": "host", "optimizer": "host", "optimizer_kind": "ftrl"}}
    # the offload is priced for the dense parameters: the tables "*" would cover stay on the device
    # with their sparse optimizer (exact names win over the pattern)
    dev_table = {"weights": "device", "grads": "device", "optimizer": "device", "optimizer_kind": "sparse_adam"}
    assert off.section["groups"] == {"*": {"weights": "device", "grads": "host", "master_weights": "host",
                                           "optimizer": "host", "optimizer_kind": "adam"},
                                     "deep_emb.weight": dev_table, "wide_emb.weight": dev_table}
    assert resolve(off.section, "wide_emb.weight")["optimizer"] == "device"
    # the tables keep their own entries next to the offload pattern (exact names win)
    assert resolve(both.section, "deep_emb.weight")["optimizer_kind"] == "sparse_adam"
    assert resolve(both.section, "deep.0.weight")["master_weights"] == "host"
    for o in opts[1:]:
        p = o.section["predicted"]
        assert set(p) >= {"host_s", "link_bytes", "saved_bytes", "overlap_s", "exposed_s", "alternatives"}
        assert p["exposed_s"] == o.extra_time_s and p["saved_bytes"] == o.device_bytes_saved
        assert p["overlap_s"] == pytest.approx(p["host_s"] - p["exposed_s"], abs=1e-12)
        validate_section(o.section)
        json.dumps(_round(o.section))                     # storable in a plan
    assert both.device_bytes_saved == pytest.approx(emb.device_bytes_saved + off.device_bytes_saved)


def test_deterministic():
    a = [dataclasses.asdict(o) for o in opts_of(wd_graph(), compute_s=0.003, micro_batches=2).values()]
    b = [dataclasses.asdict(o) for o in opts_of(wd_graph(), compute_s=0.003, micro_batches=2).values()]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_stage_without_tables_gets_block_and_name_keys():
    g = wd_graph()
    opts = placement_options(g, ["deep.1", "deep.2"], A100, S)
    assert [o.name for o in opts] == ["device", "optimizer-host"]
    assert sorted(opts[1].section["groups"]) == ["deep.1.weight", "deep.2.weight"]
    only_input = placement_options(g, ["ids"], A100, S, pins={"optimizer": "host"})
    assert [o.name for o in only_input] == ["device"]


def test_merge_stage_sections():
    from sapp.placement import merge_sections
    g = wd_graph()
    first = placement_options(g, ["ids", "wide_emb", "deep_emb", "deep.0"], A100, S, compute_s=0.01)
    second = placement_options(g, ["deep.1", "deep.2"], A100, S, compute_s=0.01)
    a = {o.name: o for o in first}["embedding+optimizer-host"].section
    b = {o.name: o for o in second}["optimizer-host"].section
    m = merge_sections([a, b])
    assert sorted(m["groups"]) == ["deep.0.weight", "deep.1.weight", "deep.2.weight", "deep_emb.weight", "wide_emb.weight"]
    assert m["predicted"]["exposed_s"] == max(a["predicted"]["exposed_s"], b["predicted"]["exposed_s"])
    assert [s["option"] for s in m["predicted"]["stages"]] == ["embedding+optimizer-host", "optimizer-host"]
    assert merge_sections([{"groups": {}, "predicted": {}}]) == {"groups": {}, "predicted": {}}


def test_pins():
    g = wd_graph()
    assert list(opts_of(g, pins={"deep_emb.*": "host"})) == ["embedding-host", "embedding+optimizer-host"]
    assert list(opts_of(g, pins={"optimizer": "host"})) == ["optimizer-host", "embedding+optimizer-host"]
    assert list(opts_of(g, pins={"optimizer": "device", "*_emb.weight": "device"})) == ["device"]
    assert list(opts_of(g, pins={"deep_emb": "host"})) == ["embedding-host", "embedding+optimizer-host"]  # module name
    only_wide = opts_of(g, pins={"deep_emb.weight": "device"})["embedding-host"]
    assert list(only_wide.section["groups"]) == ["wide_emb.weight"]
    with pytest.raises(ConstraintError, match="not a sparse embedding table"):
        opts_of(g, pins={"deep.0.weight": "host"})
    with pytest.raises(ConstraintError, match="matches no trainable parameter"):
        opts_of(g, pins={"nothing.*": "host"})
    with pytest.raises(ConstraintError, match="'host' or 'device'"):
        opts_of(g, pins={"optimizer": "cpu"})


def test_host_memory_limits_options_and_errors():
    g = wd_graph(rows=10_000_000, dim=80)
    small = A100.replace(host_memory=5e9)       # the deep table alone needs 9.6 GB on the host
    names = list(opts_of(g, small))
    assert "embedding-host" not in names and names[0] == "device"
    with pytest.raises(InfeasibleError, match=r"needs 9\.\d+ GB host memory per node .* 5\.00 GB"):
        opts_of(g, small, pins={"deep_emb.*": "host"})
    err = host_infeasible_error(g, list(g.nodes), small, S)
    assert isinstance(err, InfeasibleError) and err.capacity_bytes == 5e9 and err.needed_bytes > 9e9
    assert host_infeasible_error(g, list(g.nodes), A100, S) is None
    with pytest.raises(InfeasibleError, match="host memory per node"):
        require_host_memory(2e12, A100)
    # a stage on 2 of a node's 8 devices gets a quarter of the node's host memory
    eight = Cluster.parse("a100-80g:devices=8")
    assert placement_options(g, list(g.nodes), eight, S, dp=2)[1].section["predicted"]["host_capacity_per_node"] == 0.25e12


# ---- cost formulas -----------------------------------------------------------------------------
def test_embedding_cost_formulas():
    t = Table("deep_emb.weight", rows=1_000_000, dim=80, lookups=16000 * 26)
    c1 = embedding_host_cost([t], A100, S, micro_batches=1, compute_s=0.01)
    elems = 16000 * 26 * 80
    assert c1.link_bytes == 2 * elems * 2                                # rows in, row gradients out, bf16
    # bf16 w + 12 B Adam per element, whole at any ZeRO stage (a device sparse table runs outside
    # FSDP), and its gradient: the 416,000 rows looked up (bf16 values + an int64 index per row)
    rows_g = 16000 * 26 * (80 * 2 + 8)
    assert c1.saved_bytes == 14 * 80e6 + rows_g
    assert embedding_host_cost([t], A100, S, micro_batches=1, compute_s=0.01, dp=8, zero=3).saved_bytes == c1.saved_bytes
    assert c1.host_bytes >= 12 * 80e6                                    # fp32 table + 2 fp32 states
    assert c1.exposed_s == pytest.approx(c1.host_s) and c1.overlap_s == 0   # one micro-batch: nothing hides
    d = c1.detail
    assert d["h2d_s"] == pytest.approx(elems * 2 / A100.h2d_bw)
    # lazy Adam per touched fp32 element: read param, grad, m, v (16 B), write param, m, v (12 B),
    # coalesce the sparse gradient (8 B) = 36 B, at half the host's streaming rate (row gathers)
    assert d["optimizer_s"] == pytest.approx(elems * 36 / (A100.host_mem_bandwidth * A100.memory_efficiency * 0.5))
    # as emitted (HostEmbedding): micro-batch k+1's lookup waits for k's backward (its gradient copy is
    # backward's last node), so even with micro-batches and ample compute nothing hides
    c4 = embedding_host_cost([t], A100, S, micro_batches=4, compute_s=1.0)
    d4 = c4.detail
    assert c4.exposed_s == pytest.approx(d4["lookup_s"] + d4["h2d_s"] + d4["d2h_s"] + d4["optimizer_s"])
    assert c4.overlap_s == 0 and d4["lookup_s"] == pytest.approx(4 * d["lookup_s"])
    # tp splits the table rows between ranks; 8 devices of a node share host bandwidth
    assert embedding_host_cost([t], A100, S, tp=2).saved_bytes == pytest.approx(14 * 40e6 + 16000 * 26 * (40 * 2 + 8))
    slow = embedding_host_cost([t], A100, S, sharers=8)
    assert slow.detail["optimizer_s"] == pytest.approx(8 * c1.detail["optimizer_s"])


def test_offload_cost_formulas():
    v100 = Cluster.parse("v100-32g:devices=1")
    n = 1e9
    c = optimizer_offload_cost(n, v100, S, groups=10, micro_batches=1, compute_s=0.0)
    assert c.saved_bytes == pytest.approx(12 * n + 2 * n - 2 * (n / 10) * 2)   # optimizer + grads - 2 buckets
    assert c.host_bytes == 16 * n
    assert c.link_bytes == 2 * n + 2 * n
    t_d2h, t_h2d = 2 * n / v100.h2d_bw, 2 * n / v100.h2d_bw
    # CPU Adam per fp32 parameter: read master, grad, m, v (16 B), write master, m, v (12 B), + the
    # bf16 weight written back for the device (2 B)
    t_adam = n * (28 + 2) / (v100.host_mem_bandwidth * v100.memory_efficiency)
    # no backward to hide behind: the hooks' copies, then one worker's Adam + copy back, in series
    assert c.exposed_s == pytest.approx(t_d2h + (t_adam + t_h2d) * (1 + 1 / 10))
    busy = optimizer_offload_cost(n, v100, S, groups=10, micro_batches=1, compute_s=100.0)
    assert busy.exposed_s == pytest.approx(t_d2h + (t_adam + t_h2d) / 10)       # the worker hidden but the last group
    # ZeRO >= 1 shards what each rank offloads; fp32 training saves no half-precision copy
    z = optimizer_offload_cost(n, v100, S, dp=8, zero=2, groups=10)
    assert z.host_bytes == pytest.approx(16 * n / 8)
    f32 = optimizer_offload_cost(n, v100, CostSettings(precision="fp32"), groups=10)
    assert f32.saved_bytes == pytest.approx(8 * n + 4 * n - 2 * (n / 10) * 4)


def test_choose_prefers_device_when_it_fits():
    opts = placement_options(wd_graph(), list(wd_graph().nodes), A100, S, compute_s=0.01)
    assert choose(opts, 1e9, 80e9).name == "device"
    need = 80e9 + opts[1].device_bytes_saved / 2          # only host options fit
    best = choose(opts, need, 80e9)
    assert best.name != "device" and "device-only needs" in best.section["predicted"]["reason"]
    assert choose(opts, 1e15, 80e9) is None


def test_resolve_and_validate():
    sec = {"groups": {"*": {"optimizer": "host"}, "layers.1.*": {"optimizer": "device"},
                      "layers.1.fc.weight": {"optimizer": "host", "optimizer_kind": "adamw"}}}
    assert resolve(sec, "layers.1.fc.weight")["optimizer_kind"] == "adamw"
    assert resolve(sec, "layers.1.fc.bias")["optimizer"] == "device"
    assert resolve(sec, "head.weight")["optimizer"] == "host"
    assert resolve({"groups": {}}, "x") is None
    with pytest.raises(PlanError, match="sparse optimizer"):
        validate_section({"groups": {"w": {"weights": "host", "optimizer_kind": "adam"}}})
    with pytest.raises(PlanError, match="unknown field"):
        validate_section({"groups": {"w": {"where": "host"}}})


# ---- decisions on zoo models (the done-when figures) -----------------------------------------
_GRAPHS = {}


def zoo_graph(name, batch):
    if (name, batch) not in _GRAPHS:
        import sapp.models as M
        from sapp.capture import capture
        _GRAPHS[(name, batch)] = capture(M.get(name), batch=batch)
    return _GRAPHS[(name, batch)]


@pytest.mark.parametrize("name,cluster,kw,expect", [
    ("wide-deep-100m", "a100-80g:devices=1", {}, "embedding-host"),
    ("wide-deep-1m", "a100-80g:devices=1", {}, "device"),
    ("gpt-10b", "v100-32g:devices=1", {"micro_batches": 8}, "optimizer-host"),
    # fits with 3 GB to spare once autocast's fp32 activations are priced (gpt3-1.3b no longer does)
    ("gpt3-760m", "v100-32g:devices=1", {"micro_batches": 8}, "device"),
])
def test_zoo_decisions(name, cluster, kw, expect):
    from bench.placement_standalone import decide
    g = zoo_graph(name, 16000 if name.startswith("wide") else 1)
    d = decide(g, Cluster.parse(cluster), S, **kw)
    assert d.name == expect
    p = d.option.section["predicted"]
    assert p["reason"] and p["device_bytes_needed"] <= p["device_capacity"]
    if expect == "embedding-host":
        grp = d.option.section["groups"]
        assert grp["deep_emb.weight"]["optimizer_kind"] == "sparse_adam"
        assert grp["wide_emb.weight"]["optimizer_kind"] == "ftrl"
        assert "device-only needs" in p["reason"]
    if name == "gpt-10b":       # model states alone (16 B/param) exceed the 32 GB device
        assert 16 * g.param_count() > 32e9 and d.option.section["groups"]["*"]["master_weights"] == "host"


def test_gpt10b_on_8_v100_zero3_beats_offload_and_host_limit():
    from bench.placement_standalone import decide
    g, v8 = zoo_graph("gpt-10b", 1), Cluster.parse("v100-32g:devices=8")
    z3 = decide(g, v8, S, dp=8, zero=3, micro_batches=8)
    off = decide(g, v8, S, dp=8, zero=2, micro_batches=8)       # ZeRO-2 alone does not fit: offload
    assert z3.name == "device" and off.name == "optimizer-host"
    assert z3.step_time_s < off.step_time_s
    # without ZeRO every rank would keep a full fp32 optimizer copy on the host: 8 x 161 GB > 512 GB
    with pytest.raises(InfeasibleError, match="host memory per node"):
        decide(g, v8, S, dp=8, zero=0, micro_batches=8)
