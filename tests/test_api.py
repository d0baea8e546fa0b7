"""sapp.search / sapp.evaluate on small zoo models: the Plan schema, byte-identical output,
re-scoring, refusing another model's plan, and compatibility with emit's plan checks."""
import importlib

import pytest

import sapp
from sapp.api import evaluate, search
from sapp.errors import PlanError

CLUSTER = "a100-80g:nodes=1"


@pytest.fixture(scope="module")
def tiny_plan():
    return search("gpt-small", CLUSTER, global_batch=16)


def test_plan_sections(tiny_plan):
    d = tiny_plan.to_dict()
    par = d["parallel"]
    assert par["dp"] * par["tp"] * par["pp"] == d["devices"] == 8
    assert d["model"]["name"] == "gpt-small" and d["model"]["global_batch"] == 16
    assert d["predicted"]["step_time_s"] > 0 and 0 < d["predicted"]["mfu"] < 1
    assert d["predicted"]["peak_memory_bytes"] <= d["cluster"]["device_memory"]
    assert set(d["predicted"]["memory"]) >= {"params", "grads", "optimizer", "activations"}
    ops = d["operators"]
    assert ops and all(len(o["split"]) == len(d["mesh"]["levels"]) == len(o["out"]) for o in ops.values())
    pipe = d["pipeline"]
    assert pipe["micro_batches"] * pipe["micro_batch_size"] * par["dp"] == 16
    blocks = [b for s in pipe["stages"] for b in s["blocks"]]
    assert blocks == [f"layers.{i}" for i in range(4)]
    assert d["notes"]


def test_same_inputs_byte_identical_json(tiny_plan):
    again = search("gpt-small", CLUSTER, global_batch=16)
    assert again.to_json() == tiny_plan.to_json()


def test_evaluate_rescores_the_plan(tiny_plan, tmp_path):
    path = tmp_path / "plan.json"
    tiny_plan.save(path)
    loaded = sapp.Plan.load(path)
    ev = evaluate("gpt-small", CLUSTER, loaded)
    assert ev["step_time_s"] == pytest.approx(tiny_plan["predicted"]["step_time_s"], rel=1e-5)
    assert ev["peak_memory_bytes"] == pytest.approx(tiny_plan["predicted"]["peak_memory_bytes"], rel=1e-5)
    assert ev["fits"]


def test_evaluate_refuses_another_models_plan(tiny_plan):
    with pytest.raises(PlanError, match="fingerprint"):
        evaluate("gpt-tiny", CLUSTER, tiny_plan)


def test_hand_edited_plan_is_rescored(tiny_plan):
    d = tiny_plan.to_dict()
    d["recompute"] = {"default": "full", "blocks": {}}
    ev = evaluate("gpt-small", CLUSTER, sapp.Plan(d))
    assert ev["step_time_s"] > tiny_plan["predicted"]["step_time_s"]      # recomputation costs time
    assert ev["memory"]["activations"] <= tiny_plan["predicted"]["memory"]["activations"] + 1


def test_pinned_tensor_and_interleaved_pipeline_plan():
    plan = search("gpt-small", CLUSTER, global_batch=16,
                  constraints={"tp": 2, "pp": 2, "schedule": "interleaved", "virtual_chunks": 2, "micro_batches": 4})
    d = plan.to_dict()
    assert {k: v for k, v in d["parallel"].items() if k != "sp"} == {"dp": 2, "tp": 2, "pp": 2}
    st = d["pipeline"]["stages"]
    assert len(st) == 4 and [s["blocks"] for s in st] == [["layers.0"], ["layers.1"], ["layers.2"], ["layers.3"]]
    assert [s["split_before"] for s in st] == ["layers.1", "layers.2", "layers.3", None]
    assert [s["devices"] for s in st] == [[0, 4], [4, 8], [0, 4], [4, 8]]
    assert set(d["tp_modules"].values()) <= {"colwise", "rowwise", "vocab"}
    checks = importlib.import_module("sapp.emit.checks.plan")
    checks.check_pipeline(plan)
    assert checks.split_points(plan) == ["layers.1", "layers.2", "layers.3"]
    models = importlib.import_module("sapp.models")
    model = models.get("gpt-small")
    names = {n for n, _ in model.named_modules()}
    assert set(d["tp_modules"]) <= names


def test_user_module_needs_example_inputs():
    import torch
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    plan = search(m, "cpu:gpus=2", global_batch=32, example_inputs=(torch.randn(4, 64),))
    assert plan["devices"] == 2 and plan["parallel"]["pp"] == 1
    with pytest.raises(sapp.SappError):
        search(m, "cpu:gpus=2", global_batch=32)
