"""torchtitan's 2024 job TOML (the schema of its published Llama 3.1 benchmark, torchtitan 9dec370) read
as that stack ran it (sapp/engines/torchtitan_2412.py, issue 54): its own fields choose the runtime
profile, its batch and degrees are read where that schema keeps them, and what it states that sapp
does not price is refused in one line.  The fixture is torchtitan 9dec370's train_configs/llama3_8b.toml
unchanged (bench/torchtitan_published/llama3_8b_9dec370.toml)."""
from __future__ import annotations

import pytest

from bench.published_torchtitan import GRAND_TETON, PEAKS, job_text
from sapp import api
from sapp.costmodel import CostSettings
from sapp.costmodel.torchtitan import FA2_OVER_CUDNN, attention_scale, pass_bytes
from sapp.engines import import_config
from sapp.engines.mapping import EngineError

FILE = "llama3_8b_9dec370.toml"
NVL = GRAND_TETON.format(nodes=1, peak=PEAKS["nvl"])


@pytest.fixture(scope="module")
def llama8b():
    return api.capture_graph(api.resolve_model("llama3-8b")[0])[0]


def _import(text, graph, engine="torchtitan@0.2.2"):
    return import_config(text, engine, graph, api.resolve_cluster(NVL), "llama3-8b")


def test_the_benchmarks_file_is_read_where_its_schema_keeps_the_batch_and_degrees(llama8b):
    plan = _import(job_text(FILE, {"batch_size": 2}), llama8b)
    assert plan["model"]["global_batch"] == 16                  # batch_size 2 on each of the 8 GPUs
    assert plan["parallel"]["dp"] == 8 and plan["parallel"]["tp"] == 1 and plan["zero"] == 3
    assert plan["settings"]["runtime"] == "torchtitan-2412"
    assert any("before 2025-02" in n for n in plan["notes"])
    # the degrees under [training], as 9dec370 reads them
    tp2 = _import(job_text(FILE, {"batch_size": 2, "tensor_parallel_degree": 2}), llama8b)
    assert (tp2["parallel"]["tp"], tp2["parallel"]["dp"]) == (2, 4)


def test_the_profile_follows_the_files_own_fields(llama8b):
    eager = _import(job_text(FILE, {"batch_size": 2}), llama8b)
    comp = _import(job_text(FILE, {"batch_size": 2, "compile": "true"}), llama8b)
    assert comp["settings"]["runtime"] == "torchtitan-2412+compile"
    assert any("torch.compile is on" in n for n in comp["notes"])
    # the 0.2.2 job file with the same batch: that release on a current stack (cuDNN attention, a fused norm)
    now = _import(job_text("llama3_8b.toml", {"local_batch_size": 2}), llama8b)
    assert now["settings"]["runtime"] == "torchtitan-0.2.2"
    steps = [p["predicted"]["step_time_s"] for p in (now, comp, eager)]
    assert steps[0] < steps[1] < steps[2]           # the eager norm, then FlashAttention-2, cost time
    # through `--from torchtitan` (a TOML given to 0.3's reader) the same plan
    same = _import(job_text(FILE, {"batch_size": 2}), llama8b, engine="torchtitan")
    assert same["predicted"]["step_time_s"] == eager["predicted"]["step_time_s"]


def test_compile_fuses_the_norm_and_keeps_the_attention_kernel(llama8b):
    norm = next(n for n in llama8b.nodes.values() if n.kind == "norm" and "rms_norm" in n.target)
    eager, comp = CostSettings(runtime="torchtitan-2412"), CostSettings(runtime="torchtitan-2412+compile")
    assert pass_bytes(norm, {}, eager) is not None and pass_bytes(norm, {}, comp) is None
    assert attention_scale(False, comp) == FA2_OVER_CUDNN[0] and attention_scale(True, comp) == FA2_OVER_CUDNN[1]


def test_float8_table_is_the_tensorwise_recipe(llama8b):
    text = job_text(FILE, {"batch_size": 2, "compile": "true", "enable_float8_linear": "true"})
    plan = _import(text, llama8b)
    assert plan["settings"]["fp8"] == "tensorwise"


@pytest.mark.parametrize("edits, words", [
    ({"norm_type": '"fused_rmsnorm"'}, "norm_type = 'fused_rmsnorm'"),
    ({"pipeline_parallel_degree": 2}, "pipeline_parallel_degree > 1"),
    ({"enable_float8_linear": "true\nscaling_type_input = \"delayed\""}, "delayed float8 scaling"),
    ({"enable_float8_linear": "true\nenable_fsdp_float8_all_gather = true"}, "float8 weights"),
    ({"warmup_steps": "200\nlocal_batch_size = 2"}, "mixes torchtitan's 2024 schema"),
    ({"warmup_steps": "200\nfrobnicate = 1"}, "[training] frobnicate"),
])
def test_what_is_not_priced_is_refused_in_one_line(llama8b, edits, words):
    text = job_text(FILE, {"batch_size": 2, **edits})
    with pytest.raises(EngineError) as e:
        _import(text, llama8b)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_an_imported_2024_plan_exports_as_priced_and_says_which_stack(llama8b):
    from sapp.engines import export_plan
    plan = _import(job_text(FILE, {"batch_size": 2}), llama8b)
    text, out, notes = export_plan(plan, "torchtitan@0.2.2", graph=llama8b, cluster=api.resolve_cluster(NVL))
    assert not notes                                   # nothing re-priced: the comparison search keeps the stack
    assert out["settings"]["runtime"] == "torchtitan-2412"
    assert out["predicted"]["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"], rel=1e-9)
    assert "# NOTE: priced on torchtitan's Dec 2024 stack (torchtitan-2412)" in text
