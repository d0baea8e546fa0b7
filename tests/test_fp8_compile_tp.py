"""torchao's tensorwise FP8 casts as the block runs them, eager or compiled, and torchtitan's float8
tensor-parallel collectives (sapp/costmodel/fp8.py), read from the job file of torchtitan's June 2025
benchmark, torchtitan 820504e (sapp/engines/torchtitan_2506.py, issue 54 item 4).  The fixtures are
that commit's train_configs/llama3_8b.toml unchanged (bench/torchtitan_published/llama3_8b_820504e.toml)."""
from __future__ import annotations

import json

import pytest

from bench.published_torchtitan import GRAND_TETON, PEAKS, job_text
from sapp import api
from sapp.costmodel import CostSettings
from sapp.costmodel.dtypes import ensure_widths, fp8_share_of
from sapp.costmodel.edges import edge_times
from sapp.costmodel.fp8 import AMAX, CAST_BOTH, CAST_ONE, EAGER_CAST, LAYOUT_COPY, is_fp8_linear, tensorwise_casts
from sapp.costmodel.layouts import reshard_time
from sapp.engines import export_plan, import_config
from sapp.engines.mapping import EngineError

FILE = "llama3_8b_820504e.toml"
CLUSTER = GRAND_TETON.format(nodes=1, peak=PEAKS["nvl"]) + f",fp8_peak_flops={2 * PEAKS['nvl']:.0f}"
FLOAT8 = ('# converters = ["float8"]', 'converters = ["float8"]')


@pytest.fixture(scope="module")
def llama8b():
    return api.capture_graph(api.resolve_model("llama3-8b")[0])[0]


def _text(**edits):
    text = job_text(FILE, {"local_batch_size": 1, **edits})
    return text.replace(*FLOAT8)


def _import(text, graph):
    return import_config(text, "torchtitan@0.2.2", graph, api.resolve_cluster(CLUSTER), "llama3-8b")


def test_the_files_compile_and_tp_choose_the_profile_and_the_recipe(llama8b):
    eager = _import(_text(), llama8b)
    assert eager["settings"]["runtime"] == "torchtitan-2412" and eager["settings"]["fp8"] == "tensorwise"
    comp = _import(_text(compile="true", tensor_parallel_degree=2), llama8b)
    assert comp["settings"]["runtime"] == "torchtitan-2412+compile"
    assert comp["settings"]["fp8"] == "tensorwise-tp"          # apply_tp's enable_float8_tensorwise_tp
    assert any("mid-2025" in n for n in comp["notes"])
    # torchtitan 0.2.2's own file with its converter on: apply_tp looks for "float8", so bf16 collectives
    v022 = job_text("llama3_8b.toml", {"local_batch_size": 1, "tensor_parallel_degree": 2}).replace(
        '# converters = ["float8"]', 'converters = ["quantize.linear.float8"]')
    assert _import(v022, llama8b)["settings"]["fp8"] == "tensorwise"


def test_compile_on_takes_the_cast_kernels_time_off_the_step(llama8b):
    bf16 = {c: _import(_text(compile=c).replace(*reversed(FLOAT8)), llama8b)["predicted"]["step_time_s"]
            for c in ("false", "true")}
    f8 = {c: _import(_text(compile=c), llama8b)["predicted"]["step_time_s"] for c in ("false", "true")}
    # what FP8 adds or saves beyond the bf16 step of the same profile: torchao's ops one kernel each (eager)
    # cost more than FP8's faster GEMMs save; compiled, the casts are a few passes and FP8 gains
    assert f8["false"] > bf16["false"]
    assert f8["true"] < bf16["true"]
    assert (f8["false"] - bf16["false"]) - (f8["true"] - bf16["true"]) > 0.05 * bf16["true"]


def test_the_casts_count_torchaos_passes(llama8b):
    ensure_widths(llama8b)
    wq = next(n for n in llama8b.nodes.values() if is_fp8_linear(n) and n.module.endswith("attn.wq"))
    w2 = next(n for n in llama8b.nodes.values() if is_fp8_linear(n) and n.module.endswith("mlp.w2"))

    def count(node, runtime, fp8="tensorwise", tp=1):
        def numel(o):           # tp splits wq's output (column-parallel) and w2's input (row-parallel)
            t = node.out if o is None else o
            n = t.numel
            col = node is wq
            if tp > 1 and ((o is None and col) or (o is not None and o.param is None and not col)
                           or (o is not None and o.param is not None)):
                n /= tp
            return n
        return tensorwise_casts(node, numel, CostSettings(fp8=fp8, runtime=runtime), fp8_share_of(node)), numel
    (f, fl), (b, bl) = count(wq, "torchtitan-2412")[0]
    x, w, y = wq.operands[0].numel, wq.operands[1].numel, wq.out.numel
    assert f == pytest.approx(EAGER_CAST * (x + w))                     # X and W, op by op
    assert b == pytest.approx(EAGER_CAST * (y + x + w) + LAYOUT_COPY * (x + y))     # dY, X and W again
    (f, _), (b, _) = count(wq, "torchtitan-2412+compile")[0]
    # compiled: the X that wq, wk and wv read is cast once (a third each), both layouts in one kernel
    assert f == pytest.approx((AMAX + CAST_BOTH) * x / 3 + (AMAX + CAST_ONE) * w)
    assert b == pytest.approx((AMAX + CAST_BOTH) * y + CAST_ONE * w)
    # float8 tensor parallelism (tp 8): wq's X cast on the sequence shard before its fp8 all-gather,
    # w2's output gradient likewise before backward's
    (f, _), (b, _) = count(wq, "torchtitan-2412+compile", "tensorwise-tp", 8)[0]
    assert f == pytest.approx((AMAX + CAST_ONE) * (x / 8 / 3 + w / 8))
    ((f2, _), (b2, _)), _ = count(w2, "torchtitan-2412+compile", "tensorwise-tp", 8)
    y2 = w2.out.numel
    assert b2 == pytest.approx((AMAX + CAST_ONE) * y2 / 8 + LAYOUT_COPY * y2 + LAYOUT_COPY * w2.operands[0].numel / 8
                               + CAST_ONE * w2.operands[1].numel / 8)


def test_float8_tensor_parallelism_gathers_one_byte_an_element(llama8b):
    from sapp.cluster.mesh import Mesh
    from sapp.costmodel.edges import edge_layouts
    plan = _import(_text(compile="true", tensor_parallel_degree=2), llama8b)
    ops, mesh, cl = plan["operators"], Mesh.from_dict(plan["mesh"]), api.resolve_cluster(CLUSTER)
    norm = next(n for n in llama8b.nodes.values() if n.kind == "norm" and n.block is not None)
    wq = next(n for n in llama8b.nodes.values() if is_fp8_linear(n) and n.operands[0].producer == norm.name)
    wo = next(n for n in llama8b.nodes.values() if is_fp8_linear(n) and n.module.endswith("attn.wo"))
    add = next(n for n in llama8b.nodes.values() if any(o.producer == wo.name for o in n.operands))
    i = next(k for k, o in enumerate(add.operands) if o.producer == wo.name)
    edges = {"gather in": (norm, wq, wq.operands[0]), "reduce-scatter out": (wo, add, add.operands[i])}
    got = {}
    for name, (prod, cons, o) in edges.items():
        sp, sc = tuple(ops[prod.name]["split"]), tuple(ops[cons.name]["split"])
        for fp8 in ("tensorwise", "tensorwise-tp"):
            st = CostSettings(fp8=fp8, runtime="torchtitan-2412+compile")
            got[name, fp8] = edge_times(prod, o, sp, sc, mesh, cl, st, consumer=cons)
        f_src, f_dst, b_src, b_dst = edge_layouts(prod, o, sp, sc)
        got[name, "layouts"] = (f_src, f_dst, b_src, b_dst, o.numel)
    f_src, f_dst, b_src, b_dst, n = got["gather in", "layouts"]
    assert got["gather in", "tensorwise"][0] > 0            # sequence parallelism gathers wq's input
    assert got["gather in", "tensorwise"][0] == pytest.approx(reshard_time(f_src, f_dst, 2.0 * n, mesh, cl))
    assert got["gather in", "tensorwise-tp"][0] == pytest.approx(reshard_time(f_src, f_dst, 1.0 * n, mesh, cl))
    # its backward (the reduce-scatter of dX, a GEMM's bf16 output) stays bf16
    assert got["gather in", "tensorwise-tp"][1] == pytest.approx(got["gather in", "tensorwise"][1])
    f_src, f_dst, b_src, b_dst, n = got["reduce-scatter out", "layouts"]
    # wo's reduce-scatter stays bf16; backward's all-gather of its output gradient moves fp8
    assert got["reduce-scatter out", "tensorwise-tp"][0] == pytest.approx(got["reduce-scatter out", "tensorwise"][0])
    assert got["reduce-scatter out", "tensorwise"][1] > 0
    assert got["reduce-scatter out", "tensorwise-tp"][1] == pytest.approx(reshard_time(b_src, b_dst, 1.0 * n, mesh, cl))


def test_a_float8_tp_plan_exports_to_022_repriced_with_bf16_collectives(llama8b, tmp_path):
    plan = _import(_text(compile="true", tensor_parallel_degree=2), llama8b)
    text, exported, notes = export_plan(plan, "torchtitan@0.2.2", graph=llama8b)
    assert any("tensorwise-tp" in n and "bf16" in n for n in notes)
    assert exported["settings"]["fp8"] == "tensorwise"
    assert exported["predicted"]["step_time_s"] > plan["predicted"]["step_time_s"]


@pytest.mark.parametrize("edit, match", [
    (lambda t: t + "\n[compile]\nenable = true\n", "mixes torchtitan's mid-2025 schema"),
    (lambda t: t.replace('converters = ["float8"]', 'converters = ["float8", "mx"]'), "converter only"),
    (lambda t: t.replace("[float8]", "[float8]\nforce_recompute_fp8_weight_in_bwd = true"), "recomputed in backward"),
    (lambda t: t.replace("[float8]", '[float8]\nrecipe_name = "rowwise"'), "rowwise"),
])
def test_what_sapp_does_not_price_is_refused_in_one_line(llama8b, edit, match):
    with pytest.raises(EngineError, match=match) as e:
        _import(edit(_text()), llama8b)
    assert "\n" not in str(e.value)


def test_sapp_import_reads_the_file(tmp_path, capsys):
    from sapp.commands.cli import main
    path = tmp_path / "llama3_8b.toml"
    path.write_text(_text(compile="true", tensor_parallel_degree=8))
    out = tmp_path / "plan.json"
    assert main(["import", "--from", "torchtitan@0.2.2", str(path), "--model", "llama3-8b", "--cluster", CLUSTER,
                 "--out", str(out), "--no-compare"]) == 0
    plan = json.loads(out.read_text())
    assert plan["settings"]["fp8"] == "tensorwise-tp" and plan["settings"]["runtime"] == "torchtitan-2412+compile"


def _v022(compile_body):
    text = job_text("llama3_8b.toml", {"local_batch_size": 1}).replace(
        '# converters = ["float8"]', 'converters = ["quantize.linear.float8"]')
    return text.replace('[compile]\nenable=false\ncomponents = ["model", "loss"]', "[compile]\n" + compile_body)


def test_a_022_file_with_compile_on_is_priced_compiled_and_exports_so(llama8b):
    eager = _import(_v022("enable = false"), llama8b)
    comp = _import(_v022("enable = true"), llama8b)        # 0.2.2's default components: model and loss
    assert (eager["settings"]["runtime"], comp["settings"]["runtime"]) == ("torchtitan-0.2.2",
                                                                           "torchtitan-0.2.2+compile")
    assert comp["predicted"]["step_time_s"] < eager["predicted"]["step_time_s"]     # the float8 casts compiled
    assert any("float8 casts priced compiled" in n for n in comp["notes"])
    loss_only = _import(_v022('enable = true\ncomponents = ["loss"]'), llama8b)
    assert loss_only["settings"]["runtime"] == "torchtitan-0.2.2"
    text, exported, notes = export_plan(comp, "torchtitan@0.2.2", graph=llama8b)
    assert not notes and '[compile]\nenable = true\ncomponents = ["model"]' in text
    back = _import(text, llama8b)
    assert back["settings"]["runtime"] == "torchtitan-0.2.2+compile"
    assert back["predicted"]["step_time_s"] == pytest.approx(comp["predicted"]["step_time_s"], rel=1e-6)
