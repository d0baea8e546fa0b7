"""The schema's fast check of large simply typed sections (sapp/schema/fast.py): a plan's 2,600-entry
`operators` map is checked without jsonschema, and every verdict and message equals jsonschema's
over the whole document."""
import copy

import pytest

from sapp.schema import _rank, _validator, describe, first_error
from sapp.schema.fast import simple, stand_ins


def _full(doc):
    errors = list(_validator("plan").iter_errors(doc))
    return describe(min(errors, key=_rank)) if errors else None


@pytest.fixture(scope="module")
def big():
    from sapp.api import search
    d = search("gpt-tiny", "cpu:gpus=2", global_batch=4).to_dict()
    ops = list(d["operators"].values())
    d["operators"] = {f"op{i}": copy.deepcopy(ops[i % len(ops)]) for i in range(600)}   # over the 256 threshold
    return d


BAD = [("split", [3]), ("split", "a0"), ("split", [True]), ("out", [None]), ("out", {"a": 1}),
       ("module", 7), ("module", ["x"]), ("kind", None), ("kind", 1.5)]


def test_a_valid_plan_checks_its_operators_without_jsonschema(big):
    assert simple(_validator("plan").schema["properties"]["operators"])
    assert stand_ins(_validator("plan").schema, big) == {"operators": {}}
    assert first_error("plan", big) is None is _full(big)


@pytest.mark.parametrize("field,value", BAD)
def test_a_bad_operator_entry_gets_jsonschema_s_own_message(big, field, value):
    d = copy.deepcopy(big)
    d["operators"]["op517"][field] = value
    assert stand_ins(_validator("plan").schema, d) is None
    msg = first_error("plan", d)
    assert msg == _full(d) and msg.startswith("operators.op517." + field)


@pytest.mark.parametrize("entry", [None, 3, "x", [], True])
def test_an_operator_that_is_no_object_is_refused_as_before(big, entry):
    d = copy.deepcopy(big)
    d["operators"]["op3"] = entry
    assert first_error("plan", d) == _full(d) and first_error("plan", d).startswith("operators.op3 must be an object")


def test_an_error_elsewhere_is_found_beside_valid_operators(big):
    d = copy.deepcopy(big)
    d["operators"]["op9"]["extra_field"] = {"anything": [1]}       # the schema allows unknown fields here
    d["devices"] = "four"
    assert first_error("plan", d) == _full(d) and first_error("plan", d).startswith("devices must be")
