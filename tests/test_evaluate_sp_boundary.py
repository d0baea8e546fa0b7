"""A searched plan re-scores at the search's own price under sequence parallelism with a pipeline: the
stream is cut at the first block's entry in both (the plan's stages never end on the embedding's
replicated output), so the boundary sends are the per-tp-rank shards the search priced.  Before, the
evaluate path priced the embedding cut's whole replica: Llama 3 8B tp 8 pp 2 +3.4%, Llama 3 405B 8K
+21% (2.75 s of sends against 0.35 s), which `sapp calibrate --from-run` and `sapp replan` inherit."""
import pytest

import sapp
from sapp import api


@pytest.mark.parametrize("pins", [{"tp": 8, "pp": 2, "sp": True},
                                  {"tp": 4, "pp": 2, "sp": True, "cp": 2},
                                  {"tp": 8, "pp": 4, "sp": True, "schedule": "interleaved", "virtual_chunks": 2}])
def test_evaluate_of_a_searched_sp_pipeline_plan_is_its_price(pins):
    plan = sapp.search("llama3-8b", "h100-80g:nodes=4", global_batch=32, constraints=pins, runtime="fused")
    res = api.evaluate("llama3-8b", None, plan)
    assert res["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"], rel=1e-5)
    assert res["comm_by_kind"]["pp_p2p"] == pytest.approx(plan["predicted"]["comm_by_kind"]["pp_p2p"], rel=1e-5)
