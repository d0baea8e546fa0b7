import json

import pytest

from sapp import Plan, PlanError
from sapp.plan import SCHEMA, empty_sections


def make(**over):
    d = {"schema": SCHEMA, "model": {"name": "m", "fingerprint": "abc"}, "cluster": {}, "devices": 8,
         "parallel": {"dp": 2, "tp": 2, "pp": 2}, "mesh": {"levels": []}, "operators": {},
         "predicted": {"step_time_s": 1 / 3, "peak_memory_bytes": 1e9, "mfu": 0.5, "compute_s": 0.2, "comm_s": 0.1}}
    d.update(empty_sections())
    d.update(over)
    return d


def test_roundtrip_is_byte_identical(tmp_path):
    p = Plan(make())
    p.save(tmp_path / "a.json")
    q = Plan.load(tmp_path / "a.json")
    assert q == p and q.to_json() == (tmp_path / "a.json").read_text()
    assert q.parallel["tp"] == 2 and q.predicted["step_time_s"] == 0.333333
    assert q.to_dict()["parallel"] == {"dp": 2, "pp": 2, "tp": 2}


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.update(schema="sapp.plan/0"), "schema is"),
    (lambda d: d.pop("predicted"), "missing field"),
    (lambda d: d["parallel"].update(dp=3), "does not equal devices"),
    (lambda d: d["parallel"].update(tp=0), "parallel.tp must be >= 1"),
    (lambda d: d.update(zero=5), "zero must be"),
    (lambda d: d["predicted"].pop("mfu"), "predicted.mfu is missing"),
    (lambda d: d["pipeline"].update(micro_batches=0), "micro_batches"),
])
def test_invalid_plans_are_refused_with_one_line(mutate, needle):
    d = make()
    mutate(d)
    with pytest.raises(PlanError) as e:
        Plan(d)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_corrupt_json_and_other_model(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text(Plan(make()).to_json()[:-20])
    with pytest.raises(PlanError, match="not valid JSON"):
        Plan.load(f)
    with pytest.raises(PlanError, match="not found"):
        Plan.load(tmp_path / "nope.json")
    p = Plan(make())
    p.check_model("abc")
    with pytest.raises(PlanError, match="made for model 'm'"):
        p.check_model("zzz", "other")


def test_non_finite_prediction_refused():
    with pytest.raises(PlanError, match="non-finite"):
        Plan(make(predicted={"step_time_s": float("inf"), "peak_memory_bytes": 1, "mfu": 0, "compute_s": 0, "comm_s": 0}))
