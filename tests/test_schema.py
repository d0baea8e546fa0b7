"""The published schemas: well-formed JSON Schemas, shipped as package data, printed by `sapp schema`,
and in agreement with what sapp writes (checked with jsonschema directly, not through sapp's wrapper)."""
import json
import pathlib
import tomllib

import jsonschema
import pytest
from referencing import Registry, Resource

from sapp import schema
from sapp.commands.cli import main
from sapp.cluster import PRESETS, Cluster
from sapp.errors import ClusterError, PlanError
from sapp.plan import Plan

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _raw(name):
    return json.loads((ROOT / "sapp" / "schema" / f"{name}.schema.json").read_text())


def _plain_validator(name):
    reg = Registry().with_resources(
        (f"https://sapp.dev/schema/{n}.schema.json", Resource.from_contents(_raw(n))) for n in ("plan", "cluster"))
    return jsonschema.Draft202012Validator(_raw(name), registry=reg)


@pytest.mark.parametrize("name", ["plan", "cluster"])
def test_schemas_are_valid_json_schemas(name):
    jsonschema.Draft202012Validator.check_schema(_raw(name))


@pytest.mark.parametrize("name", ["plan", "cluster"])
def test_sapp_schema_prints_the_file(name, capsys):
    assert main(["schema", name]) == 0
    assert json.loads(capsys.readouterr().out) == _raw(name)


def test_schemas_ship_as_package_data():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "*.schema.json" in cfg["tool"]["setuptools"]["package-data"]["sapp.schema"]
    deps = cfg["project"]["dependencies"]
    assert any(d.startswith("jsonschema") for d in deps)
    assert "hypothesis" in cfg["project"]["optional-dependencies"]["test"]


def test_every_preset_and_its_file_match_the_cluster_schema(tmp_path):
    v = _plain_validator("cluster")
    for name, c in PRESETS.items():
        v.validate(json.loads(json.dumps(c.to_dict())))
        c.save(tmp_path / f"{name}.json")
        v.validate(json.loads((tmp_path / f"{name}.json").read_text()))


def test_searched_plan_matches_the_plan_schema(tmp_path):
    from sapp.api import search
    plan = search("gpt-tiny", "a100-80g:nodes=1", global_batch=16, constraints={"pp": 2})
    plan.save(tmp_path / "p.json")
    _plain_validator("plan").validate(json.loads((tmp_path / "p.json").read_text()))


def test_schema_refusals_agree_with_jsonschema():
    """What sapp refuses for shape, plain jsonschema refuses too (sapp adds only stricter integers)."""
    full = Cluster.parse("h100-80g").to_dict()
    v = _plain_validator("cluster")
    for bad in ({}, dict(full, peak_flops="fast"), dict(full, nodes=0), dict(full, precision="fp8"),
                dict(full, bogus=1), {k: x for k, x in full.items() if k != "inter_bw"}):
        assert not v.is_valid(bad)
        with pytest.raises(ClusterError):
            Cluster.from_dict(bad)


def test_integers_are_ints_not_floats_or_booleans():
    assert schema.first_error("cluster", dict(Cluster().to_dict(), nodes=2.0)) == "nodes must be a whole number, got 2.0"
    assert "must be a whole number, got true" in schema.first_error("cluster", dict(Cluster().to_dict(), nodes=True))


def test_save_revalidates_in_place_edits(tmp_path):
    from sapp.api import search
    plan = search("gpt-tiny", "cpu", global_batch=8)
    plan["parallel"]["dp"] = "two"          # sections are plain dicts: an edit must not reach the file
    with pytest.raises(PlanError, match="parallel.dp"):
        plan.save(tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists()


def test_strict_json_refuses_non_finite_tokens():
    for text in ('{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}', '{"a": 1e999}'):
        with pytest.raises(ValueError):
            schema.strict_loads(text)
    assert schema.strict_loads('{"a": 1e300}') == {"a": 1e300}
