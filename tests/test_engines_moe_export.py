"""MoE models through the Megatron export and back (issue 52 findings 6, 7 and MoE beside tp): the
dense and the experts' FFN widths kept apart, Qwen2-MoE's gated shared expert carried, and tensor
parallelism beside any MoE layer with the sequence parallelism Megatron-Core's MoE layer requires;
each checked with Megatron-Core's own code where the `engines` extra is installed."""
from __future__ import annotations

import pytest

import sapp.engines as E
from sapp.engines import EngineError
from sapp.engines.megatron import tokens

from tests import engine_validate


@pytest.fixture(scope="module")
def deepseek():
    from sapp import api
    graph = api.capture_graph(api.resolve_model("deepseek-v3-like")[0])[0]
    return graph, api.resolve_cluster("h100-80g:nodes=32")


def test_deepseek_export_reads_back_at_the_same_price(deepseek):
    # issue 52 finding 6: the dense FFN (18432) was compared with the experts' (2048) and the export refused
    from sapp import api
    graph, cl = deepseek
    plan = api.search("deepseek-v3-like", cl, graph=graph, global_batch=2048, runtime="fused",
                      constraints={"target": "megatron", "tp": 1, "pp": 16, "ep": 8, "dp": 16})
    text, exported, _ = E.export_plan(plan, "megatron", graph=graph, cluster=cl)
    args = tokens(text)
    assert (args["--ffn-hidden-size"], args["--moe-ffn-hidden-size"]) == ("18432", "2048")
    back = E.import_config(text, "megatron", graph, cl, "deepseek-v3-like")
    assert back["predicted"]["step_time_s"] == pytest.approx(exported["predicted"]["step_time_s"], rel=1e-9)
    assert back["predicted"]["peak_memory_bytes"] == pytest.approx(exported["predicted"]["peak_memory_bytes"], rel=1e-9)
    # another experts' width, or a dense width given to the experts by Megatron's default, is refused in one line
    for other in (text.replace("--moe-ffn-hidden-size 2048", "--moe-ffn-hidden-size 4096"),
                  text.replace("--moe-ffn-hidden-size 2048\n", "")):
        with pytest.raises(EngineError) as e:
            E.import_config(other, "megatron", graph, cl, "deepseek-v3-like")
        msg = str(e.value)
        assert "ffn-hidden-size" in msg and "experts" in msg and "\n" not in msg, msg
