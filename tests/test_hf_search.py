"""Capture + search on models nobody on the team wrote: HF transformers GPT-2 and BERT from configs."""
import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402

import sapp  # noqa: E402
from sapp.api import search  # noqa: E402


def _check(plan, devices):
    assert plan.devices == devices
    assert plan.parallel["dp"] * plan.parallel["tp"] * plan.parallel["pp"] == devices
    assert 0 < plan.predicted["step_time_s"] and plan.predicted["peak_memory_bytes"] <= plan.predicted["capacity_bytes"]
    assert plan.operators and all(len(o["split"]) == len(plan.mesh["levels"]) for o in plan.operators.values())


def test_search_hf_gpt2_and_bert():
    cfg = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=1024, n_positions=128, use_cache=False)
    with torch.device("meta"):
        gpt2 = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 1024, (8, 128))
    p = search(gpt2, "a100-80g:nodes=1", global_batch=64, example_inputs=(ids,))
    _check(p, 8)
    assert any(b.startswith("transformer.h.") for s in p.pipeline["stages"] for b in s.get("blocks", [])) \
        or p.parallel["pp"] == 1
    # pinned 2-way pipeline splits at a GPT-2 block boundary
    p2 = search(gpt2, "a100-80g:nodes=1", global_batch=64, example_inputs=(ids,), constraints={"pp": 2})
    _check(p2, 8)
    assert p2.pipeline["stages"][0]["split_before"].startswith("transformer.h.")

    bcfg = transformers.BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                                   intermediate_size=1024, vocab_size=1024, max_position_embeddings=128)
    with torch.device("meta"):
        bert = transformers.BertForMaskedLM(bcfg)
    q = search(bert, "a100-80g:nodes=2", global_batch=64, example_inputs=(torch.randint(0, 1024, (8, 128)),))
    _check(q, 16)


def test_uncapturable_model_gives_one_line_error():
    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))

        def forward(self, x):
            if x.sum() > 0:          # data-dependent Python control flow
                return x * self.w
            return x

    # with real inputs the branch is captured as their values take it (test_capture_retry.py);
    # a meta model with meta inputs cannot tell the branch: refused
    with torch.device("meta"):
        gate = Gate()
    with pytest.raises(sapp.CaptureError) as e:
        search(gate, "a100-80g:nodes=1", global_batch=8, example_inputs=(torch.ones(8, 4, device="meta"),))
    assert "\n" not in str(e.value) and "Gate" in str(e.value)
