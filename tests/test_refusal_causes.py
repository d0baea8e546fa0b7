"""Refusals that name the real cause and a change that helps (issue 51, finding 6).  A tensor-parallel
layout the model cannot run at one rank's shapes was refused with capture's hint "pass example_inputs
matching forward(...)" (the inputs are fine: the global graph captured with them) and "shard other
layers" (no flag does that); the manifest's refusal said "regenerate the plan", which writes the same
plan again."""
import pytest
import torch

from tests.test_tp_gather_block import NanoGPT, SEQ


def test_tp_refusal_names_the_block_and_the_layers_to_leave_out():
    from sapp.emit.checks import shape_audit
    from sapp.errors import PlanError
    with torch.device("meta"):
        model = NanoGPT()
    ids = torch.zeros(2, SEQ, dtype=torch.long, device="meta")
    styles = {"transformer.h.0.attn.c_attn": "colwise", "transformer.h.0.attn.c_proj": "rowwise"}
    with pytest.raises(PlanError) as e:
        shape_audit.check(model, styles, [list(styles)], 2, (ids,), [], fix=True)
    msg = str(e.value)
    assert "example_inputs" not in msg and "shard other layers" not in msg and "\n" not in msg, msg
    # the try that ran furthest speaks (shape_audit.check): with the stored sizes at a rank's share the
    # view by the module-level head count runs and gives 4 heads of 4 where the split implies 2 of 8
    assert "module 'transformer.h.0.attn', op aten.view.default gives [2, 8, 4, 4] on a rank where the plan " \
           "implies [2, 8, 2, 8]" in msg, msg
    assert "leave transformer.h.0.attn.c_attn, transformer.h.0.attn.c_proj out of tp_modules" in msg, msg
    assert e.value.gather == sorted(styles), e.value.gather


def test_manifest_refusal_names_the_fields_own_change():
    from sapp.emit.checks.manifest import _remedy
    assert "tp_modules" in _remedy("tp_modules: plan {...}, emitted {...}")
    assert "pp=1" in _remedy("stages: plan {'0': ['c1']}, emitted {'0': []}")
    assert _remedy("precision: plan 'fp32', emitted 'bf16-mixed'") == "set the plan's precision to the emitted value"
    assert all("regenerate" not in _remedy(f + ": x") for f in ("tp_modules", "stages", "zero", "recompute", "ep"))
