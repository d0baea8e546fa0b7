"""`--fit-engine-estimate`: plans whose Megatron-LM startup memory estimate (sapp/engines/megatron_estimate.py,
Megatron's own formula) fits as well as sapp's price.  The four exports of tests/test_engines_params.py."""
import functools
import subprocess
import sys

import pytest

from sapp import api
from sapp import engines as E
from sapp.engines.estimate_fit import file_estimate_bytes, megatron_fit_for

from test_engines_params import CASES


@functools.lru_cache(maxsize=None)
def _export(case, fit):
    model, cluster, pins = CASES[case]
    cl = api.resolve_cluster(cluster)
    graph, _ = api.capture_graph(api.resolve_model(model)[0])
    fits = None
    if fit:                      # True: main's formula; or a release's ("core_v0.16.1")
        fits = megatron_fit_for(graph, cl, precision=cl.precision, version=fit if isinstance(fit, str) else "main")
    plan = E.best_plan(graph, cl, "megatron", global_batch=None, model=model, constraints=pins, fits=fits,
                       settings={"runtime": "fused"})
    text, exported, _ = E.export_plan(plan, "megatron", graph=graph, cluster=cl)
    return text, exported, cl


@pytest.mark.slow                  # (30 s; python -m bench.megatron_estimate_fit prints the same four)
@pytest.mark.parametrize("case", list(CASES))
def test_exports_fit_by_megatrons_own_estimate(case):
    text, exported, cl = _export(case, fit=True)
    assert file_estimate_bytes(text, cl.devices) <= cl.usable_memory
    assert exported["predicted"]["peak_memory_bytes"] <= cl.usable_memory


@pytest.mark.slow      # two searches of GPT-3 175B, about 20 s; `python -m bench.megatron_estimate_fit` runs four
def test_the_estimate_changes_the_plan_only_where_it_must():
    # GPT-3 175B on 1024 A100s: the fastest plan's estimate counts fp32 main_grads Megatron does not keep
    free, free_plan, cl = _export("gpt3-175b", fit=False)
    fit, fit_plan, _ = _export("gpt3-175b", fit=True)
    assert file_estimate_bytes(free, cl.devices) > cl.usable_memory >= file_estimate_bytes(fit, cl.devices)
    assert fit_plan["predicted"]["step_time_s"] >= free_plan["predicted"]["step_time_s"]


def test_core_v0_16_1_formula_fits_mixtral_too():
    # that release's formula divides the routed experts by tp only: with ep 8 pinned the search finds a
    # plan it also fits (main's formula fits the free plan)
    text, plan, cl = _export("mixtral-8x7b-ep8", "core_v0.16.1")
    free, _, _ = _export("mixtral-8x7b-ep8", False)
    assert file_estimate_bytes(free, cl.devices, "core_v0.16.1") > cl.usable_memory
    assert file_estimate_bytes(text, cl.devices, "core_v0.16.1") <= cl.usable_memory
    assert plan["predicted"]["peak_memory_bytes"] <= cl.usable_memory


def test_cli_refuses_the_flag_without_megatron(tmp_path):
    r = subprocess.run([sys.executable, "-m", "sapp.commands.cli", "search", "--model", "gpt2", "--cluster", "a100-80g:devices=8",
                        "--fit-engine-estimate"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--target megatron" in r.stderr and "Traceback" not in r.stderr


def test_export_notes_an_estimate_that_reads_as_not_fitting(tmp_path, capsys):
    from sapp.commands.cli import main
    _, free_plan, cl = _export("gpt3-175b", fit=False)
    _, fit_plan, _ = _export("gpt3-175b", fit=True)
    for plan, over in ((free_plan, True), (fit_plan, False)):
        path = tmp_path / "plan.json"
        plan.save(str(path))
        assert main(["export", str(path), "--to", "megatron", "--out", str(tmp_path / "args.txt")]) == 0
        err = capsys.readouterr().err
        assert ("startup memory estimate" in err and "--fit-engine-estimate" in err) == over, err


def test_a_model_megatron_does_not_build_is_refused_in_one_line():
    r = subprocess.run([sys.executable, "-m", "sapp.commands.cli", "search", "--model", "resnet50", "--cluster",
                        "a100-80g:devices=8", "--target", "megatron", "--fit-engine-estimate"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "Megatron builds its own GPT model" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
