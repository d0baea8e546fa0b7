"""Plans the search builds skip the JSON Schema check (Plan.built: only the structural and semantic
checks run); this is the edge that still holds them to the schema: every plan built here over a spread
of models and options validates against sapp/schema/plan.schema.json, loads back unchanged, and is
byte-identical when the same search runs twice."""
import json

import pytest

from sapp import Plan, PlanError
from sapp import schema as _schema
from sapp.api import capture_graph, resolve_model, search

# (model, cluster, search keywords): dp / tp / pp, MoE with ep, SP + CP, host tables, an MLP
CASES = [
    ("gpt-tiny", "cpu:nodes=2", {}),
    ("gpt-small", "a100-80g:nodes=1", {"constraints": {"tp": 2, "pp": 2, "schedule": "interleaved",
                                                       "virtual_chunks": 2}}),
    ("llama-tiny", "h100-80g:nodes=1", {"constraints": {"tp": 2, "cp": 2, "sp": True}}),
    ("moe-tiny", "h100-80g:nodes=1", {"constraints": {"ep": 2}}),
    ("wide-deep-tiny", "cpu:nodes=1", {"constraints": {"placement": {"optimizer": "host"}}}),
    ("mlp-tiny", "v100-32g:nodes=1", {"constraints": {"zero": 3}}),
]

_graphs = {}


def _search(model, cluster, kw):
    if model not in _graphs:
        _graphs[model] = capture_graph(resolve_model(model)[0])[0]
    return search(model, cluster, graph=_graphs[model], **kw)


@pytest.mark.parametrize("model, cluster, kw", CASES, ids=[c[0] for c in CASES])
def test_built_plan_validates_and_is_deterministic(model, cluster, kw, tmp_path):
    plan = _search(model, cluster, kw)
    text = plan.to_json()
    assert _schema.first_error("plan", json.loads(text)) is None
    assert Plan.from_json(text).to_json() == text          # load (schema checked) keeps every byte
    assert _search(model, cluster, kw).to_json() == text   # the search run again: the same bytes
    plan.save(tmp_path / "p.json")
    assert (tmp_path / "p.json").read_text() == text


def test_save_checks_a_built_plan_edited_since(tmp_path):
    plan = _search("gpt-tiny", "cpu:nodes=2", {})
    plan["mesh"]["levels"] = "two"          # sections are plain dicts: an in-place edit the schema refuses
    with pytest.raises(PlanError, match="mesh.levels"):
        plan.save(tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists()
