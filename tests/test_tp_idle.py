"""A free search never spends devices on a tensor-parallel level that shards nothing (every tp rank
computing the whole model) when the same devices can serve data or pipeline parallelism.  Tiny
models on 8 devices used to get tp=2..4 "that shards nothing" at small global batches."""
import os
import sys

import pytest

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.emit_workers import hf_models  # noqa: E402

IDLE = "tensor parallelism shards nothing"


@pytest.mark.parametrize("gb", [4, 2])
def test_free_search_gives_no_idle_tp_on_a_tiny_model(gb):
    from sapp.api import search
    m, _ = hf_models.build("opt", device="meta")
    x, y = hf_models.batch("opt", gb, 0)
    plan = search(m, "cpu:gpus=8", global_batch=gb, example_inputs=x, loss_fn=hf_models._ce, targets=y)
    par = plan["parallel"]
    assert par["tp"] == 1, par
    assert not any(IDLE in n for n in plan["notes"])
    assert par["dp"] * par["pp"] * par.get("cp", 1) == 8


def test_a_pinned_idle_tp_is_kept_and_said():
    from sapp.api import search
    m, _ = hf_models.build("opt", device="meta")
    x, y = hf_models.batch("opt", 4, 0)
    plan = search(m, "cpu:gpus=8", global_batch=4, example_inputs=x, loss_fn=hf_models._ce, targets=y,
                  constraints={"tp": 2})
    assert plan["parallel"]["tp"] == 2 and any(IDLE in n for n in plan["notes"])
