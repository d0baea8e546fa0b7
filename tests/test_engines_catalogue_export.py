"""The catalogue decoders sapp now writes Megatron models of (issue 52 item 1) go through the whole path:
`sapp search --target megatron` on the HF config, export, and import of the file back with the model,
at the same price; an imported file whose query/key norm or partial rotary differs from the model is
refused in one line naming the flag (Megatron would build another attention than the one priced)."""
from __future__ import annotations

import pytest

import sapp.engines as E
from sapp import api
from sapp.engines import EngineError
from sapp.engines.megatron import tokens

from tests.test_engines_arch import _hf_config


def _round_trip(path):
    graph = api.capture_graph(api.resolve_model(path)[0])[0]
    cl = api.resolve_cluster("h100-80g:devices=8")
    plan = E.best_plan(graph, cl, "megatron", global_batch=None, model=path, constraints={},
                       settings={"runtime": "fused"})
    text, exported, notes = E.export_plan(plan, "megatron", graph=graph, cluster=cl)
    back = E.import_config(text, "megatron", graph, cl, path)
    assert back["predicted"]["step_time_s"] == pytest.approx(exported["predicted"]["step_time_s"], rel=1e-6)
    return text, graph, cl


@pytest.mark.parametrize("cls,flag,value", [("Qwen3Config", "--qk-layernorm", True),
                                            ("StableLmConfig", "--rotary-percent", "0.25")])
def test_a_new_decoder_exports_imports_and_refuses_another_attention(cls, flag, value, tmp_path):
    path = _hf_config(tmp_path, cls)
    text, graph, cl = _round_trip(path)
    assert tokens(text)[flag] == value
    other = "\n".join(ln for ln in text.splitlines() if not ln.startswith(flag))
    with pytest.raises(EngineError) as e:
        E.import_config(other, "megatron", graph, cl, path)
    assert flag in str(e.value) and "\n" not in str(e.value), str(e.value)
