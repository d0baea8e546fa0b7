"""Every bad input issue #17 lists, each refused with a one-line SappError naming the field, quickly,
before any work starts (regression tests; tests/test_fuzz.py generates the rest)."""
import json
import math
import time

import pytest

import sapp
from sapp import Plan
from sapp.api import evaluate, search
from sapp.commands.cli import main
from sapp.cluster import Cluster
from sapp.search.constraints import Constraints
from sapp.errors import CaptureError, ClusterError, ConstraintError, PlanError, SappError


@pytest.fixture(scope="module")
def plan_dict():
    return search("gpt-tiny", "cpu", global_batch=8).to_dict()


def _cli_error(argv, capsys, needle):
    """Runs the CLI; it must exit 2 with one line on stderr containing `needle` and no traceback."""
    t0 = time.perf_counter()
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert needle in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    return time.perf_counter() - t0


def _forbid(monkeypatch, target):
    def boom(*a, **k):
        raise AssertionError(f"{target} ran although the arguments were bad")
    monkeypatch.setattr(target, boom)


# ---- output paths, checked before the work ----------------------------------------------------------
@pytest.mark.parametrize("out, needle", [("/nonexistent/dir/p.json", "does not exist"), (".", "is a directory")])
def test_search_out_checked_before_search(out, needle, capsys, monkeypatch):
    _forbid(monkeypatch, "sapp.api.search")
    _cli_error(["search", "--model", "gpt-tiny", "--cluster", "cpu", "--out", out], capsys, needle)


def test_plot_unknown_extension(plan_dict, tmp_path, capsys):
    path = tmp_path / "p.json"
    Plan(plan_dict).save(path)
    _cli_error(["plot", str(path), "--out", str(tmp_path / "x.unknownext")], capsys, "unknown file type .unknownext")
    _cli_error(["plot", str(path), "--out", str(tmp_path / "x.png"), "--width", "100000"], capsys, "width")


@pytest.mark.parametrize("out", ["/nonexistent/dir/c.json", "/tmp", "c.txt"])
def test_calibrate_out_checked_before_measuring(out, capsys, monkeypatch):
    _forbid(monkeypatch, "sapp.calibrate.calibrate")
    _cli_error(["calibrate", "--out", out, "--quick"], capsys, "--out")


def test_saving_to_a_bad_path_is_a_plan_error(plan_dict, tmp_path):
    with pytest.raises(PlanError, match="cannot write plan"):
        Plan(plan_dict).save(tmp_path / "missing" / "p.json")


# ---- sapp run pre-checks ----------------------------------------------------------------------------
@pytest.mark.parametrize("extra, needle", [
    (["--nnodes", "0"], "--nnodes"), (["--nnodes", "2:1"], "--nnodes"), (["--nproc", "0"], "--nproc"),
    (["--steps", "0"], "--steps"), (["--model-arg", "dropout=abc"], "dropout"),
    (["--model-arg", "dropout=NaN"], "dropout"), (["--model-arg", "nosuch=1"], "nosuch"),
    (["--model-arg", "dropout=5"], "dropout"), (["--out", "/nonexistent/x.json"], "--out"),
])
def test_run_prechecks(extra, needle, plan_dict, tmp_path, capsys, monkeypatch):
    _forbid(monkeypatch, "subprocess.call")
    path = tmp_path / "p.json"
    Plan(plan_dict).save(path)
    _cli_error(["run", str(path), "--model", "gpt-tiny"] + extra, capsys, needle)


# ---- clusters ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, needle", [
    ("a100-80g:nodes=inf", "nodes"), ("a100-80g:nodes=nan", "nodes"), ("a100-80g:nodes=1e999", "nodes"),
    ("a100-80g:inter_bw=1e999", "inter_bw"), ("a100-80g:nodes=1e18", "devices"),
    ("cpu:gpus=1000000000", "gpus_per_node"), ("a100-80g:nodes=2,nodes=3", "nodes twice"),
    ("a100-80g:peak_flops=true", "peak_flops"),
])
def test_bad_cluster_specs_fail_fast(spec, needle):
    t0 = time.perf_counter()
    with pytest.raises(ClusterError) as e:
        Cluster.parse(spec)
    assert needle in str(e.value) and time.perf_counter() - t0 < 1.0


def test_cluster_parse_of_a_non_string_says_so():
    with pytest.raises(ClusterError, match="must be a string.*got int"):
        Cluster.parse(5)


def _file(tmp_path, content, name="c.json"):
    p = tmp_path / name
    (p.write_bytes if isinstance(content, bytes) else p.write_text)(content)
    return p


@pytest.mark.parametrize("content, needle", [
    (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not text"),
    ("{}", "missing field"),
    ("__DROP_PEAK__", "peak_flops"),
    ("__PEAK_TRUE__", "peak_flops must be a number, got true"),
    ("__INF_BW__", "not usable JSON"),
    ("__HUGE_BW__", "not usable JSON"),
])
def test_bad_cluster_files(content, needle, tmp_path):
    full = Cluster.parse("a100-80g").to_dict()
    text = {"__DROP_PEAK__": json.dumps({k: v for k, v in full.items() if k != "peak_flops"}),
            "__PEAK_TRUE__": json.dumps(dict(full, peak_flops=True)),
            "__INF_BW__": json.dumps(dict(full, inter_bw=math.inf)),          # writes Infinity
            "__HUGE_BW__": json.dumps(full).replace(json.dumps(full["inter_bw"]), "1e999")}.get(content, content)
    with pytest.raises(ClusterError) as e:
        Cluster.load(_file(tmp_path, text))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_cluster_file_extension_is_case_blind(tmp_path):
    c = Cluster.parse("v100-32g:nodes=2")
    c.save(tmp_path / "ok.JSON")
    assert Cluster.parse(str(tmp_path / "ok.JSON")) == c


def test_cluster_object_checks_booleans_and_infinities():
    with pytest.raises(ClusterError, match="peak_flops"):
        Cluster(peak_flops=True).validate()
    with pytest.raises(ClusterError, match="intra_bw"):
        Cluster(intra_bw=math.inf).validate()


# ---- global batch -----------------------------------------------------------------------------------
@pytest.mark.parametrize("gb", ["abc", math.nan, math.inf, [16], 1.5, 0, -3, 10**30, True])
def test_search_refuses_bad_global_batch_before_capture(gb, monkeypatch):
    _forbid(monkeypatch, "sapp.api.capture_graph")
    with pytest.raises(ConstraintError, match="global batch"):
        search("gpt-tiny", "cpu", global_batch=gb)


@pytest.mark.parametrize("gb, needle", [("abc", "must be a whole number"), (0, "must be >= 1"),
                                         (1.5, "must be a whole number"), ([16], "must be a whole number"),
                                         (10**30, "must be <=")])
def test_plan_global_batch(gb, needle, plan_dict):
    d = json.loads(json.dumps(plan_dict))
    d["model"]["global_batch"] = gb
    with pytest.raises(PlanError) as e:
        Plan(d)
    assert "model.global_batch" in str(e.value) and needle in str(e.value)


def test_cli_batch_too_large_is_refused_fast(capsys):
    took = _cli_error(["search", "--model", "gpt-tiny", "--cluster", "cpu", "--batch", "1000000000000"],
                      capsys, "global batch")
    assert took < 2.0


# ---- plans with wrong types: every reader refuses them with the field's name ------------------------
WRONG = [
    (("cluster",), "a100"), (("settings",), []), (("recompute",), "full"), (("placement",), 3),
    (("alternatives",), {"a": 1}), (("alternatives",), [{"parallel": "dp"}]), (("pipeline", "stages"), "x"),
    (("pipeline", "stages"), [{"blocks": "layers.0"}]), (("predicted", "step_time_s"), "fast"),
    (("predicted", "memory"), [1]), (("parallel", "dp"), True), (("zero",), True), (("devices",), 2.0),
    (("operators",), []), (("recompute", "blocks"), {"layers.0": "some"}), (("mesh", "levels"), [{"size": "2"}]),
]


def _set(d, path, value):
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


@pytest.mark.parametrize("path, value", WRONG)
def test_wrong_types_refused_by_every_reader(path, value, plan_dict, tmp_path, capsys):
    d = json.loads(json.dumps(plan_dict))
    _set(d, path, value)
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(d))
    field = ".".join(path)
    for argv in (["explain", str(f)], ["diff", str(f), str(f)], ["plot", str(f), "--out", str(tmp_path / "x.png")],
                 ["evaluate", str(f)]):
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and field.split(".")[0] in err and "Traceback" not in err, (argv, err)


@pytest.mark.parametrize("path, value, needle", [
    (("parallel", "dp"), True, "parallel.dp must be a whole number, got true"),
    (("pipeline", "stages"), [{"blocks": "layers.0"}], "pipeline.stages[0].blocks must be an array"),
    (("model", "global_batch"), 0, "model.global_batch must be >= 1"),
    (("zero",), True, "zero must be one of 0, 1, 2, 3"),
])
def test_plan_messages_name_the_field(path, value, needle, plan_dict):
    d = json.loads(json.dumps(plan_dict))
    _set(d, path, value)
    with pytest.raises(PlanError) as e:
        Plan(d)
    assert needle in str(e.value)


def test_plan_with_a_billion_micro_batches_is_not_drawn(plan_dict, tmp_path):
    d = json.loads(json.dumps(plan_dict))
    d["pipeline"]["micro_batches"] = 10**9
    with pytest.raises(PlanError, match="micro_batches"):          # more than the batch has samples
        Plan(d)
    d["model"].pop("global_batch")
    t0 = time.perf_counter()
    with pytest.raises(SappError, match="micro_batches"):          # no batch to compare: the chart refuses
        sapp.report.plot(Plan(d), tmp_path / "x.png")
    assert time.perf_counter() - t0 < 2.0


def test_split_naming_no_dim_of_its_operator(plan_dict):
    d = json.loads(json.dumps(plan_dict))
    name = next(iter(d["operators"]))
    d["operators"][name]["split"] = ["zz"] * len(d["operators"][name]["split"])
    with pytest.raises(PlanError, match=f"operators.{name}.split names dim 'zz'"):
        evaluate("gpt-tiny", None, Plan(d))


def test_plan_cluster_section_must_be_complete_to_evaluate(plan_dict):
    d = json.loads(json.dumps(plan_dict))
    d["cluster"].pop("peak_flops")
    with pytest.raises(ClusterError, match="peak_flops"):
        evaluate("gpt-tiny", None, Plan(d))


# ---- constraints ------------------------------------------------------------------------------------
def test_zero_true_is_not_zero_one():
    with pytest.raises(ConstraintError, match="zero"):
        Constraints(zero=True)


def test_zero_with_one_replica_is_refused(capsys, monkeypatch):
    _cli_error(["search", "--model", "gpt-tiny", "--cluster", "cpu", "--zero", "3", "--dp", "1"], capsys, "zero=3")


def test_virtual_chunks_alone_pin_interleaving():
    assert Constraints(virtual_chunks=2).schedule == "interleaved"
    plan = search("gpt-small", "a100-80g:nodes=1", constraints={"virtual_chunks": 2})
    assert plan["pipeline"]["schedule"] == "interleaved" and plan["pipeline"]["virtual_chunks"] == 2
    with pytest.raises(ConstraintError, match="virtual_chunks >= 2"):
        Constraints(schedule="interleaved", virtual_chunks=1)


# ---- capture ----------------------------------------------------------------------------------------
def test_keyword_only_forward_given_positional_inputs():
    import torch
    from torch import nn

    class KwOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, *, x):
            return self.lin(x).sum()

    with pytest.raises(CaptureError, match="do not fit KwOnly.forward"):
        search(KwOnly(), "cpu", example_inputs=(torch.randn(4, 8),), global_batch=4)


def test_capture_failure_prints_no_torch_traceback(capfd):
    import torch
    from torch import nn

    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x.view(3, 7))

    with pytest.raises(CaptureError):
        search(Bad(), "cpu", example_inputs=(torch.randn(4, 8),), global_batch=4)
    assert "Traceback" not in capfd.readouterr().err
