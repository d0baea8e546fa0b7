"""Presets that do not lie (issue 14, item 8): V100 has no bf16 (fp16 with loss scaling is what it
trains in), and a prediction from the uncalibrated CPU preset says it is one, in the plan's notes and
in `sapp evaluate`."""
import pytest
import torch

from sapp.cluster import PRESETS, Cluster
from sapp.costmodel import CostSettings


def test_v100_prices_fp16_mixed_at_half_precision_widths():
    assert PRESETS["v100-32g"].precision == "fp16-mixed"
    st = CostSettings(precision="fp16-mixed")
    # fp32 master weights and Adam moments (12 B), 2 B weights and gradients, as bf16-mixed
    assert (st.weight_bytes, st.grad_bytes, st.optimizer_bytes) == (2, 2, 12)
    assert st.act_bytes("float32") == 2 and st.act_bytes("int64") == 8


def test_a_v100_plan_is_fp16_and_notes_loss_scaling():
    from sapp.api import search
    p = search("gpt-tiny", "v100-32g:nodes=1,gpus=1", global_batch=8)
    assert p["settings"]["precision"] == "fp16-mixed"
    assert any("loss scaling" in n for n in p["notes"])


def test_an_fp16_plan_emits_fp16_autocast():
    from sapp.emit.build import plan_precision
    from tests.emit_workers.plans import make_plan
    assert plan_precision(make_plan(precision="fp16-mixed")) == "fp16-mixed"
    import sapp.models as zoo
    from sapp.emit import emit
    model = zoo.get("mlp-tiny", device="cpu")
    prog = emit(model, make_plan(name="mlp-tiny", precision="fp16-mixed"), rank=0, world=1,
                device=torch.device("cpu"), check_fingerprint=False)
    assert prog.precision == "fp16-mixed"
    with prog.autocast():
        assert torch.get_autocast_dtype("cpu") == torch.float16


def test_uncalibrated_cpu_preset_says_so_and_calibrated_figures_do_not():
    from sapp.api import search
    p = search("mlp-tiny", "cpu:gpus=2", global_batch=8)
    assert any("uncalibrated 'cpu' preset" in n and "sapp calibrate" in n for n in p["notes"])
    q = search("mlp-tiny", "cpu:gpus=2,compute_scale=1.7,op_overhead=40us", global_batch=8)
    assert not any("uncalibrated" in n for n in q["notes"])


def test_sapp_evaluate_prints_the_uncalibrated_note(tmp_path, capsys):
    from sapp.api import search
    from sapp.commands.cli import main
    path = tmp_path / "plan.json"
    search("mlp-tiny", "cpu:gpus=2", global_batch=8).save(str(path))
    main(["evaluate", str(path), "--model", "mlp-tiny"])
    assert "uncalibrated 'cpu' preset" in capsys.readouterr().out
