"""The "torchtitan" runtime profile (costmodel/settings.py): torchtitan 0.2.2's op-level selective
checkpointing (recompute/op_sac.py), fp32 gradient reduction and bf16 activations, priced by hand on
llama-tiny (2 layers, h 64, 4 heads / 2 kv, ffn 128, s 32, vocabulary 256), and torchtitan's published
job files imported through it (bench/torchtitan_published)."""
import os

import pytest

from sapp import api
from sapp.cluster import PRESETS
from sapp.costmodel import CostSettings
from sapp.costmodel.gradsync import param_sync
from sapp.costmodel.primitives import staging_copy_time
from sapp.costmodel.torchtitan import fsdp_copy_bytes
from sapp.engines import EngineError, import_config
from sapp.cluster.mesh import Mesh
from sapp.pipeline.units import split_units
from sapp.recompute.op_sac import kept_bytes, kept_ops, recompute_seconds

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "torchtitan_published")
TT = CostSettings(runtime="torchtitan")


@pytest.fixture(scope="module")
def tiny():
    return api.capture_graph(api.resolve_model("llama-tiny")[0])[0]


def _block(graph, i=0):
    return [u for u in split_units(graph) if u.kind == "block"][i].nodes


def test_op_sac_keeps_every_other_mm_and_attention(tiny):
    names = _block(tiny)
    kept = kept_ops(tiny, names)
    weights = {tiny.nodes[n].params[0].rsplit(".", 2)[-2] for n in kept if tiny.nodes[n].params}
    # mms in forward order wq wk wv wo w1 w3 w2: the 1st, 3rd, 5th, 7th saved
    assert weights == {"wq", "wv", "w1", "w2"}
    assert [tiny.nodes[n].kind for n in kept if not tiny.nodes[n].params] == ["attention"]


def test_op_sac_bytes_by_hand(tiny):
    names = _block(tiny)
    kept = kept_ops(tiny, names)
    strategies = {n: () for n in tiny.nodes}
    b, s, h, kv_dim, ffn = tiny.batch_size, 32, 64, 2 * 16, 128
    # bf16 outputs: wq (h) + wv (kv heads x 16) + attention (h) + w1 (ffn) + w2 (h) per token
    assert kept_bytes(tiny, kept, strategies, Mesh(()), TT) == b * s * 2 * (h + kv_dim + h + ffn + h)
    per_node = {n: {"fwd_s": 1.0, "param_comm_s": 0.5} for n in names}
    assert recompute_seconds(names, kept, per_node) == pytest.approx(0.75 * (len(names) - len(kept)))


def test_torchtitan_settings_by_hand():
    assert (TT.reduce_bytes, TT.grad_bytes, TT.weight_bytes) == (4, 2, 2)
    assert not TT.autocast and TT.loss_fp32 and TT.op_sac
    eager = CostSettings()
    assert (eager.reduce_bytes, eager.autocast, eager.loss_fp32, eager.op_sac) == (2, True, False, False)
    cl = PRESETS["h100-80g"]
    # FSDP2's fp32 reduce-scatter moves twice eager's bytes; the bf16 all-gather is the same.  The
    # profile prices FSDP2's copies from torch's code (costmodel.torchtitan.fsdp_copy_bytes) in place
    # of the generic flat-buffer staging: compare the collectives alone
    z3 = CostSettings(runtime="torchtitan", zero=3)
    tt = param_sync(1e8, 8, "intra", cl, z3)
    ea = param_sync(1e8, 8, "intra", cl, CostSettings(zero=3))
    rate = cl.mem_bandwidth * cl.memory_efficiency
    assert tt[0] == pytest.approx(2 * (ea[0] - staging_copy_time(2e8, 8, cl)))
    assert tt[1] - fsdp_copy_bytes(1e8, 8, z3)["gather_in"] / rate == pytest.approx(
        ea[1] - staging_copy_time(2e8, 8, cl))


def _toml(sel):
    return ("[parallelism]\ndata_parallel_shard_degree = -1\n[training]\nlocal_batch_size = 2\nseq_len = 32\n"
            f"[activation_checkpoint]\n{sel}\n")


def test_op_selective_import_prices_less_than_none_more_than_full(tiny):
    cl = api.resolve_cluster("h100-80g:nodes=1")
    acts = {}
    for mode in ('mode = "none"', 'mode = "selective"\nselective_ac_option = "op"', 'mode = "full"'):
        plan = import_config(_toml(mode), "torchtitan@0.2.2", tiny, cl, "llama-tiny")
        assert plan["settings"]["runtime"] == "torchtitan-0.2.2"
        acts[mode[:12]] = plan["predicted"]["memory"]["activations"]
    none, sel, full = acts.values()
    assert full < sel < none


def test_bf16_reduce_is_refused_in_one_line(tiny):
    bad = _toml('mode = "none"').replace("seq_len = 32", 'seq_len = 32\nmixed_precision_reduce = "bfloat16"')
    with pytest.raises(EngineError, match="mixed_precision_reduce") as e:
        import_config(bad, "torchtitan@0.2.2", tiny, api.resolve_cluster("h100-80g:nodes=1"), "llama-tiny")
    assert "\n" not in str(e.value)


def test_published_llama3_8b_job_imports_and_fits():
    with open(os.path.join(BENCH, "llama3_8b.toml")) as f:
        text = f.read()
    assert "[quantize.linear.float8]" in text and 'selective_ac_option = "op"' in text
    graph = api.capture_graph(api.resolve_model("llama3-8b")[0])[0]
    cl = api.resolve_cluster("a100-80g:nodes=8")          # "a preset for 64 A100 GPUs"
    plan = import_config(text, "torchtitan@0.2.2", graph, cl, "llama3-8b")
    assert plan["predicted"]["peak_memory_bytes"] <= cl.usable_memory
    assert plan["recompute"]["default"] == "selective" and plan["settings"]["runtime"] == "torchtitan-0.2.2"
    assert not any("DOES NOT FIT" in n for n in plan["notes"])


def test_bench_help():
    from bench import published_torchtitan
    with pytest.raises(SystemExit) as e:
        published_torchtitan.main(["--help"])
    assert e.value.code == 0
