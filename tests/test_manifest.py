"""The manifest: what a rank really runs, compared with the plan.  A difference is a one-line PlanError
naming the field; with allow_mismatch the run goes on with a loud note and a re-priced prediction.
(Multi-rank fields -- ZeRO stages, FSDP units, TP placements, stages, schedules -- are checked on every
rank of the truth matrix, tests/test_truth_matrix.py.)"""
import os
import sys

import pytest
import torch

import sapp
import sapp.models as models
from sapp.emit import emit
from sapp.emit.checks import manifest
from sapp.emit.recompute import checkpointing as recompute
from sapp.errors import PlanError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)          # tests/ has no __init__: make `tests.emit_workers` importable
from tests.emit_workers.plans import make_plan  # noqa: E402


def test_differences_name_the_field():
    exp = {"zero": 1, "recompute": {"layers.0": {"mode": "full", "region": "layers.0"}}, "schedule": "none"}
    obs = {"zero": 2, "recompute": {}, "schedule": "none"}
    assert manifest.differences(exp, obs) == [
        "zero: plan 1, emitted 2", "recompute: plan {'layers.0': {'mode': 'full', 'region': 'layers.0'}}, emitted {}"]
    # before the first forward the recomputed operators are unknown: not a difference yet
    exp = {"recompute": {"b": {"mode": "selective", "region": "b.attn", "ops": {"matmul": 1}}}}
    obs = {"recompute": {"b": {"mode": "selective", "region": "b.attn", "ops": None}}}
    assert manifest.differences(exp, obs) == []
    assert manifest.differences(exp, obs, runtime=True) == [
        "recompute: plan {'b': {'mode': 'selective', 'region': 'b.attn', 'ops': {'matmul': 1}}}, "
        "emitted {'b': {'mode': 'selective', 'region': 'b.attn', 'ops': None}}"]


def test_single_device_manifest_matches_a_hand_plan():
    torch.manual_seed(0)
    m = models.get("gpt-tiny", device="cpu")
    plan = make_plan(params=sum(p.numel() for p in m.parameters()), recompute_default="full",
                     recompute_blocks={"layers.1": "none"})
    prog = emit(m, plan, rank=0, world=1)
    assert prog.manifest == {"zero": 0, "fsdp_units": [], "recompute": {"layers.0": {"mode": "full", "region": "layers.0"}},
                             "tp_modules": {}, "stages": {"0": ["layers.0", "layers.1"]}, "schedule": "none",
                             "micro_batches": 1, "host": {}, "precision": "fp32", "sp": {}, "runtime": "eager",
                             "ep": 1}
    assert prog.mismatches == []


@pytest.fixture(scope="module")
def searched():
    plan = sapp.search(models.get("gpt-tiny", device="meta"), sapp.Cluster.parse("cpu:gpus=1"), global_batch=4,
                       constraints={"recompute": "full"})
    return plan


def test_an_emitter_that_drops_recompute_is_caught(searched, monkeypatch):
    # simulate the old kind of lie: the plan prices full recomputation, the program runs none
    monkeypatch.setattr(recompute, "apply", lambda *a, **k: {})
    torch.manual_seed(0)
    with pytest.raises(PlanError, match=r"^the emitted program differs from the plan: recompute: plan \{'layers.0'"):
        emit(models.get("gpt-tiny", device="cpu"), searched, rank=0, world=1)
    # sapp.emit, not sapp.emit.emit: the public entry hands the emitter its re-pricing (sapp.api.reprice_as_run)
    prog = sapp.emit(models.get("gpt-tiny", device="cpu"), searched, rank=0, world=1, allow_mismatch=True)
    assert prog.mismatches and any(n.startswith("MISMATCH (allowed): recompute") for n in prog.notes)
    # re-priced as it runs: no recomputation means less compute and more activation memory
    old = searched.predicted
    assert prog.repriced is not None
    assert prog.repriced["step_time_s"] < old["step_time_s"]
    assert prog.repriced["peak_memory_bytes"] > old["peak_memory_bytes"]
    assert any(n.startswith("MISMATCH: re-priced as run") for n in prog.notes)


def test_run_passes_allow_mismatch_to_every_rank():
    from argparse import ArgumentParser
    from sapp.commands import run
    p = ArgumentParser()
    run.add_arguments(p)
    args = p.parse_args(["plan.json", "--model", "gpt-tiny", "--allow-mismatch"])
    assert "--allow-mismatch" in run.command(args, 2)
    assert "--allow-mismatch" not in run.command(p.parse_args(["plan.json", "--model", "gpt-tiny"]), 2)


def test_a_fused_runtime_plan_is_a_runtime_mismatch():
    """A plan priced for the "fused" runtime (Megatron-Core kernels) predicts a program sapp's emitter
    does not run: emit says so in one line, and with allow_mismatch re-prices it as eager."""
    plan = sapp.search(models.get("gpt-tiny", device="meta"), sapp.Cluster.parse("cpu:gpus=1"), global_batch=4,
                       runtime="fused")
    assert plan._d["settings"]["runtime"] == "fused"
    torch.manual_seed(0)
    with pytest.raises(PlanError, match=r"^the emitted program differs from the plan: runtime: plan 'fused', emitted 'eager'"):
        emit(models.get("gpt-tiny", device="cpu"), plan, rank=0, world=1)
    prog = sapp.emit(models.get("gpt-tiny", device="cpu"), plan, rank=0, world=1, allow_mismatch=True)
    assert prog.repriced is not None
    # unfused point-wise chains move more bytes: the eager re-price is slower
    assert prog.repriced["step_time_s"] > plan.predicted["step_time_s"]


def test_the_emitter_reprices_through_the_callable_its_caller_hands_it(searched, monkeypatch):
    """The emitter sits below the api (tests/test_package_flow.py): sapp.emit.emit re-prices an allowed
    mismatch only through `reprice`, which sapp.emit and `sapp run` pass; without one it says so."""
    monkeypatch.setattr(recompute, "apply", lambda *a, **k: {})
    torch.manual_seed(0)
    prog = emit(models.get("gpt-tiny", device="cpu"), searched, rank=0, world=1, allow_mismatch=True)
    assert prog.repriced is None and any(n.startswith("MISMATCH: not re-priced") for n in prog.notes)
    seen = []

    def fake(model, plan):
        seen.append((model, plan["recompute"]["blocks"]))
        return {"step_time_s": 1.0, "peak_memory_bytes": 2**20}
    prog = emit(models.get("gpt-tiny", device="cpu"), searched, rank=0, world=1, allow_mismatch=True, reprice=fake)
    assert prog.repriced == {"step_time_s": 1.0, "peak_memory_bytes": 2**20}
    # the plan rewritten to what runs (no recomputation), the zoo model by name
    assert seen and seen[0][0] == "gpt-tiny" and set(seen[0][1].values()) == {"none"}
