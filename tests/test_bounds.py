"""Issue 27, findings 8-10: what a received plan, cluster or path cannot make sapp do.  Pins are never
silently dropped (8); every schema-valid input finishes in seconds or is refused in one line (9);
hostile but schema-valid figures and names are refused, never scored (10).  Each test failed on the
code before the fix (a wrong plan, a hang past the alarm, a traceback or a nonsense score)."""
import copy
import json
import os
import signal

import pytest

import sapp
from sapp.cluster import Cluster
from sapp.errors import ClusterError, ConstraintError, PlanError, SappError, UsageError
from sapp.plan import Plan

BOUND_S = 20.0


class Late(BaseException):
    pass


def _late(*_):
    raise Late()


@pytest.fixture
def bounded():
    """Run a call under a CPU-time alarm and a wall-clock alarm (a FIFO blocks without using CPU)."""
    old_prof, old_alrm = signal.signal(signal.SIGPROF, _late), signal.signal(signal.SIGALRM, _late)

    def run(call):
        signal.setitimer(signal.ITIMER_PROF, BOUND_S)
        signal.setitimer(signal.ITIMER_REAL, 3 * BOUND_S)
        try:
            return call()
        except Late:
            pytest.fail(f"ran past {BOUND_S} CPU s (or blocked)")
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.setitimer(signal.ITIMER_REAL, 0)
    yield run
    signal.signal(signal.SIGPROF, old_prof)
    signal.signal(signal.SIGALRM, old_alrm)


@pytest.fixture(scope="module")
def g():
    from sapp.api import capture_graph, resolve_model
    return capture_graph(resolve_model("gpt-tiny")[0])[0]


@pytest.fixture(scope="module")
def plans(g):
    pp = sapp.search("gpt-tiny", "a100-80g:nodes=1", global_batch=16, constraints={"pp": 2, "zero": 1}, graph=g)
    inter = sapp.search("gpt-tiny", "a100-80g:nodes=1,gpus=2", global_batch=4, graph=g,
                        constraints={"pp": 2, "dp": 1, "tp": 1, "schedule": "interleaved", "micro_batches": 4,
                                     "virtual_chunks": 2, "zero": 0})
    host = sapp.search("gpt-tiny", "a100-80g:nodes=1", global_batch=16, graph=g,
                       constraints={"placement": {"optimizer": "host"}})
    return {"pp": pp.to_dict(), "inter": inter.to_dict(), "host": host.to_dict()}


def _evaluate(d, g):
    return sapp.evaluate("gpt-tiny", None, Plan(d), graph=g)


# ---- finding 8: placement pins beside context parallelism ------------------------------------------
def test_host_pins_are_honoured_not_dropped_for_cp(g):
    # one sample on two devices with tp and pp pinned to 1: only cp=2 uses both, and cp runs no host
    # placement; the search used to return that cp plan with the optimizer pin silently dropped
    with pytest.raises(ConstraintError, match="context parallelism"):
        sapp.search("gpt-tiny", "cpu:gpus=2", global_batch=1, graph=g,
                    constraints={"tp": 1, "pp": 1, "placement": {"optimizer": "host"}})
    with pytest.raises(ConstraintError, match="cp=2 cannot keep anything on the host"):
        sapp.search("gpt-tiny", "cpu:gpus=2", global_batch=1, graph=g,
                    constraints={"cp": 2, "placement": {"optimizer": "host"}})
    # free: a configuration that keeps the pin (the optimizer on the host), never a cp one without it
    p = sapp.search("gpt-tiny", "cpu:gpus=2", global_batch=1, graph=g, constraints={"placement": {"optimizer": "host"}})
    assert p["parallel"].get("cp", 1) == 1
    assert p["placement"]["groups"]["*"]["optimizer"] == "host"


def test_a_pin_no_configuration_can_run_is_named(g):
    # (it used to end in "no configuration fits 7.76 GB", or in a cp plan without it)
    with pytest.raises(ConstraintError, match="embed.tok.weight is not a sparse embedding table"):
        sapp.search("gpt-tiny", "cpu:gpus=2", global_batch=2, graph=g, constraints={"placement": {"embed.tok.weight": "host"}})


# ---- finding 9: bounded work ----------------------------------------------------------------------
def test_huge_interleaved_micro_batches_refused_in_seconds(plans, g, bounded):
    d = copy.deepcopy(plans["inter"])
    d["pipeline"].update(micro_batches=1 << 22, micro_batch_size=1)
    d["model"]["global_batch"] = 1 << 22
    with pytest.raises(PlanError, match="operations a step"):
        bounded(lambda: _evaluate(d, g))        # was 184 s in pipeline/schedule.py


def test_huge_interleaved_search_refused_in_seconds(g, bounded):
    with pytest.raises(ConstraintError, match="operations a step"):
        bounded(lambda: sapp.search("gpt-tiny", "a100-80g:nodes=1,gpus=2", global_batch=1 << 22, graph=g,
                                    constraints={"pp": 2, "schedule": "interleaved", "micro_batches": 1 << 22}))


def test_simulator_refuses_past_its_bound():
    from sapp.pipeline.schedule import MAX_SCHEDULE_OPS, simulate, step_time
    m = MAX_SCHEDULE_OPS // 8 + 2
    with pytest.raises(ValueError, match="operations a step"):
        simulate([1.0, 1.0], [2.0, 2.0], m, "interleaved", v=2)
    # the closed forms need no walk: any m is priced at once
    assert step_time([1.0, 1.0], [2.0, 2.0], 1 << 40, "1f1b") == pytest.approx(((1 << 40) - 1) * 3.0 + 6.0)


def test_megabyte_model_name_refused_at_load(plans, bounded, tmp_path):
    d = copy.deepcopy(plans["pp"])
    d["model"]["name"] = "x" * (1 << 20)
    with pytest.raises(PlanError, match="model.name is a string of 1048576 characters"):
        Plan(d)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    from sapp.report import plot
    with pytest.raises(PlanError, match="limit 4096"):
        bounded(lambda: plot(Plan.load(path), tmp_path / "p.png"))     # was > 120 s in matplotlib


def test_special_files_refused_not_waited_on(plans, bounded, tmp_path):
    fifo = str(tmp_path / "plan.json")
    os.mkfifo(fifo)
    with pytest.raises(PlanError, match="FIFO"):
        bounded(lambda: Plan.load(fifo))
    with pytest.raises(ClusterError, match="FIFO"):
        bounded(lambda: Cluster.parse(fifo))
    with pytest.raises(PlanError, match="device"):
        bounded(lambda: Plan.load("/dev/zero"))
    from sapp.commands._paths import check_out
    with pytest.raises(UsageError, match="FIFO"):
        check_out(fifo)
    from sapp.commands.cli import main
    assert bounded(lambda: main(["explain", fifo])) == 2


# ---- finding 10: tracebacks and hostile plans -----------------------------------------------------
def test_deep_nesting_is_one_line(plans):
    d = copy.deepcopy(plans["pp"])
    x = d["model"].setdefault("meta", {})
    for _ in range(900):
        x["a"] = {}
        x = x["a"]
    with pytest.raises(PlanError, match="nested more than 32 levels"):
        Plan(d)
    with pytest.raises(PlanError, match="nested more than 32 levels"):
        Plan.from_json(json.dumps(d))
    c = dict(plans["pp"]["cluster"], notes=None)
    c["name"] = {"a": c["name"]}
    for _ in range(900):
        c = {"name": c}
    with pytest.raises(ClusterError, match="nested more than 32 levels"):
        Cluster.from_dict(c)


def test_none_in_place_of_a_model_or_a_path():
    with pytest.raises(SappError, match="got NoneType"):
        sapp.search(None, "cpu")
    with pytest.raises(PlanError, match="got NoneType"):
        Plan.load(None)
    with pytest.raises(ClusterError, match="got NoneType"):
        Cluster.load(None)


@pytest.mark.parametrize("key,value", [("peak_flops", 5e-324), ("intra_latency", 1.7e308), ("compute_scale", 5e-324),
                                       ("mem_bandwidth", 1e300), ("device_memory", 1e-300)])
def test_cluster_figures_outside_sane_bounds(plans, g, key, value):
    with pytest.raises(ClusterError, match=key):
        Cluster.parse(f"a100-80g:{key}={value!r}")
    d = copy.deepcopy(plans["pp"])
    d["cluster"][key] = value
    with pytest.raises(PlanError, match=f"cluster.{key}"):   # used to score "step nan" / ZeroDivisionError
        _evaluate(d, g)


def test_curves_and_fits_bounded():
    with pytest.raises(ClusterError, match="mem_bw_curve"):
        Cluster.parse("cpu").replace(mem_bw_curve=((1e6, 5e-324),))
    with pytest.raises(ClusterError, match="collective_fits"):
        Cluster.parse("cpu").replace(collective_fits={"all_reduce": [1e300, 1e9]})


def test_mfu_over_100_percent_refused(g, plans):
    spec = ("a100-80g:nodes=1,compute_scale=0.01,compute_efficiency=1,op_overhead=0,mem_bandwidth=1e16,"
            "intra_bw=1e16,intra_latency=0")
    with pytest.raises(ClusterError, match="more than the hardware can do"):
        sapp.search("gpt-tiny", spec, global_batch=64, graph=g)
    with pytest.raises(ClusterError, match="more than the hardware can do"):
        sapp.evaluate("gpt-tiny", spec, Plan(plans["pp"]), graph=g)


def test_schema_states_the_same_bounds():
    from sapp.cluster import CURVE_RANGES, RANGES
    fields = json.loads(sapp.schema.text("cluster"))["$defs"]["fields"]["properties"]
    for key, (lo, hi) in RANGES.items():
        assert (fields[key]["minimum"], fields[key]["maximum"]) == (lo, hi), key
    assert set(CURVE_RANGES) <= set(fields)


@pytest.mark.parametrize("edit,what", [
    (lambda d: d["pipeline"]["stages"][1]["blocks"].append("layers.9"), "pipeline.stages[1].blocks names 'layers.9'"),
    (lambda d: d.__setitem__("tp_modules", {"layers.0.attn.nosuch": "colwise"}), "tp_modules names 'layers.0.attn.nosuch'"),
    (lambda d: d["recompute"].__setitem__("blocks", {"layers.7": "full"}), "recompute.blocks names 'layers.7'"),
    (lambda d: d["operators"].__setitem__("ghost", d["operators"]["add"]), "operators names 'ghost'"),
])
def test_evaluate_refuses_names_the_model_lacks(plans, g, edit, what):
    d = copy.deepcopy(plans["pp"])
    _evaluate(d, g)                      # the plan itself is fine
    edit(d)
    with pytest.raises(PlanError, match=what.replace("[", r"\[").replace("]", r"\]")):
        _evaluate(d, g)


def test_evaluate_refuses_placement_groups_the_model_lacks(plans, g):
    d = copy.deepcopy(plans["host"])
    _evaluate(d, g)
    d["placement"]["groups"]["nosuch_table.weight"] = dict(d["placement"]["groups"]["*"])
    with pytest.raises(PlanError, match="placement.groups names 'nosuch_table.weight'"):
        _evaluate(d, g)
