"""A plan's fields that `sapp run` reads and `sapp evaluate` re-derives must agree, or the plan would run
otherwise than priced: a micro-batch size that does not make up the global batch and a stage placed on
another pipeline rank than the runtime uses are refused in one line; stages that list no blocks are
priced at the split points `sapp run` splits at."""
import json

import pytest

import sapp
from sapp.errors import PlanError
from sapp.plan import Plan


@pytest.fixture(scope="module")
def interleaved():
    return json.loads(sapp.search("gpt-tiny", "cpu:gpus=4", constraints={"pp": 2}, global_batch=8).to_json())


def test_micro_batch_size_must_make_up_the_global_batch(interleaved):
    d = json.loads(json.dumps(interleaved))
    d["pipeline"]["micro_batch_size"] = 1000
    with pytest.raises(PlanError, match=r"micro_batch_size=1000 x micro_batches=2 x dp=2 = 4000 samples, but "
                                        r"model.global_batch=8; set micro_batch_size to 2"):
        Plan(d)


def test_stage_on_another_pipeline_rank_is_refused(interleaved):
    d = json.loads(json.dumps(interleaved))
    for st in d["pipeline"]["stages"]:
        st["device_stage"] = 0
    with pytest.raises(PlanError, match=r"stages\[1\] \(index 1\) has device_stage=0, but stage 1 runs on pipeline rank 1"):
        Plan(d)
    for st in d["pipeline"]["stages"]:
        del st["device_stage"]                       # absent: the runtime's index mod pp
    Plan(d)


def test_stages_without_blocks_are_priced_at_their_split_points():
    model, cluster = "gpt-small", "cpu:gpus=2"
    plan = sapp.search(model, cluster, constraints={"pp": 2, "schedule": "1f1b"}, global_batch=8)
    d = json.loads(plan.to_json())
    blocks = [b for s in d["pipeline"]["stages"] for b in s["blocks"]]
    assert len(blocks) >= 4
    balanced = sapp.evaluate(model, cluster, Plan(d))
    for st in d["pipeline"]["stages"]:
        st["blocks"] = []
    d["pipeline"]["stages"][0]["split_before"] = blocks[-1]          # all but one block on stage 0
    skewed = sapp.evaluate(model, cluster, Plan(d))
    assert skewed["step_time_s"] > balanced["step_time_s"] * 1.2, (skewed["step_time_s"], balanced["step_time_s"])
