"""The bench harness: tables from a fake search (fast, deterministic), and a real quick case once
sapp.search exists."""
import csv
import json
import sys

import os

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)                       # test_report's plan factory
sys.path.insert(0, os.path.dirname(_HERE))      # the repo root: bench/ is not an installed package
from test_report import make_plan  # noqa: E402

from bench import run as bench_run  # noqa: E402
from bench.baselines import baseline_constraints, run_baseline  # noqa: E402
from sapp import Cluster, Plan  # noqa: E402
from sapp.errors import ConstraintError, InfeasibleError  # noqa: E402


class FakeSearch:
    """Step time grows when the layout is pinned; pure DP does not fit; tp must divide 4."""

    def __init__(self):
        self.calls = []
        self.exhaustive = None

    def model(self, name):
        return name

    def __call__(self, name, cluster, batch, constraints=None):
        c = constraints or {}
        self.calls.append(c)
        n = cluster.devices
        if c.get("dp") == n and c.get("zero") == 0:
            raise InfeasibleError("does not fit")
        if c.get("tp") and 4 % c["tp"]:
            raise ConstraintError("tp must divide the heads")
        if c.get("pp", 1) > 2:
            raise ConstraintError("more stages than blocks")
        pp = c.get("pp", 1)
        if c.get("tp", 1) > 1 and pp < 2:
            raise InfeasibleError("megatron needs pp >= 2 here")
        tp = c.get("tp", 1)
        dp = n // (tp * pp)
        d = make_plan(dp=dp, tp=tp, pp=pp, alternatives=False)
        d["cluster"] = cluster.to_dict()
        d["predicted"]["step_time_s"] = 1.0 + 0.5 * len(c)
        return Plan(d)


def test_baseline_constraints():
    cl = Cluster.parse("a100-80g:nodes=2")
    assert baseline_constraints("dp", cl, 16) == [{"dp": 16, "tp": 1, "pp": 1, "zero": 0, "recompute": "none"}]
    meg = baseline_constraints("megatron", cl, 16)
    assert [m["pp"] for m in meg] == [1, 2] and all(m["tp"] == 8 for m in meg)
    assert baseline_constraints("megatron", Cluster.parse("a100-80g:devices=4"), 4)[0]["tp"] == 4


def test_run_baseline_statuses():
    fake = FakeSearch()
    cl = Cluster.parse("a100-80g:nodes=2,gpus=2")
    plan, status, _ = run_baseline("dp", fake, "m", cl, 4, 64)
    assert plan is None and status == "OOM"
    plan, status, cons = run_baseline("megatron", fake, "m", cl, 4, 64)
    assert status == "ok" and cons["pp"] == 2          # smallest pp that fits
    plan, status, _ = run_baseline("zero3", fake, "m", cl, 4, 64)
    assert status == "ok"
    # all megatron pins either OOM or contradict: OOM wins over n/a
    _, status, _ = run_baseline("megatron", fake, "m", Cluster.parse("a100-80g:devices=4"), 4, 64)
    assert status == "OOM"
    _, status, _ = run_baseline("megatron", fake, "m", Cluster.parse("a100-80g:devices=8"), 8, 64)
    assert status.startswith("n/a: tp must divide")


def test_harness_tables(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_run, "Searcher", FakeSearch)
    monkeypatch.setattr(bench_run, "QUICK_CASES", [("gpt-test", 64, "a100-80g:gpus=2", (4, 8))])
    out = tmp_path / "res"
    assert bench_run.main(["--quick", "--out", str(out), "--no-exhaustive"]) == 0
    md = (out / "results.md").read_text()
    assert "Command: `python -m bench --quick" in md
    assert md.count("| gpt-test |") == 2 and "OOM" in md
    assert "vs zero3: speedup geometric mean" in md
    data = json.loads((out / "results.json").read_text())
    r = data["rows"][0]
    assert r["dp"]["status"] == "OOM"
    assert r["zero3"]["speedup"] == pytest.approx((1.0 + 0.5 * 4) / 1.0)
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert len(rows) == 2 and rows[0]["dp_status"] == "OOM" and float(rows[0]["step_s"]) == 1.0


def test_calibration_accuracy_report_helpers():
    from bench import calibration_accuracy as ca
    assert ca.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert ca.spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # a run's statistics: the median of the steady steps (what sapp run reports) and the best one
    assert ca.step_statistics({"measured_step_time_s": 0.11, "step_times_s": [0.5, 0.1, 0.11, 0.2]}) == (0.11, 0.1)
    # a round: the drift probe (machine 1.2x slower than at calibration) scales the prediction
    rec = ca.round_record(0.1, 1.2, {"measured_step_time_s": 0.13, "step_times_s": [1.0, 0.12, 0.13, 0.14]})
    assert rec["corrected_s"] == pytest.approx(0.12) and (rec["median_s"], rec["best_s"]) == (0.13, 0.12)
    assert "drift" not in ca.round_record(0.1, None, {"measured_step_time_s": 0.13})
    # a paired run (bench.paired_run): its reference block ran 1.1x slower than at calibration; all its
    # timed steps are steady (warm-ups untimed), so the best is the minimum of all of them
    paired = {"measured_step_time_s": 0.13, "step_times_s": [0.12, 0.13, 0.14], "reference_s": [0.2, 0.22, 0.23],
              "reference_median_s": 0.22}
    rec = ca.round_record(0.1, None, paired, ref_s=0.2)
    assert rec["paired_drift"] == pytest.approx(1.1) and rec["paired_s"] == pytest.approx(0.11)
    assert rec["best_s"] == 0.12 and "drift" not in rec
    assert "paired_s" not in ca.round_record(0.1, None, paired) and "paired" in ca.STATISTICS

    def rd(p, med, best, drift=None):
        r = {"predicted_s": p, "median_s": med, "best_s": best}
        if drift:
            r.update(drift=drift, corrected_s=p * drift)
        return r
    rows = [{"label": "a", "model": "m", "procs": 2, "global_batch": 8, "status": "ok",
             "predicted": {"compute_s": 0.08, "comm_s": 0.02, "bubble_s": 0.0},
             "rounds": [rd(0.1, 0.08, 0.1, 0.8), rd(0.12, 0.1, 0.12, 0.75)]},
            {"label": "b", "model": "m", "procs": 4, "global_batch": 8, "status": "run failed (exit 1): boom",
             "predicted_s": 0.2}]
    ca.combine_rounds(rows[0])
    # per statistic the median of the paired per-round errors, and the medians of the times
    assert rows[0]["error_median"] == pytest.approx(0.225) and rows[0]["error_best"] == pytest.approx(0.0)
    assert rows[0]["error_drift-corrected"] == pytest.approx(-0.05)      # 0.08/0.08 - 1 and 0.09/0.1 - 1
    assert rows[0]["predicted_s"] == pytest.approx(0.11) and rows[0]["measured_median_s"] == pytest.approx(0.09)
    stats = {st: ca.summary(rows, st) for st in ca.STATISTICS}
    assert stats["median"]["within"] == 1 and stats["median"]["worst"] == pytest.approx(0.225)
    md = ca.to_markdown(rows, {2: Cluster.parse("cpu")}, "python -m bench.calibration_accuracy", stats)
    assert ("| a | 2 | 8 | 110.0 | 90.0 | +22% | 110.0 | +0% | 0.80 0.75 | -5% | +25% +20%; +0% +0%; +0% -10% "
            "| 80.0 / 20.0 / 0.0 |") in md
    assert "run failed (exit 1): boom" in md and md.count("within +-25 %: 1 of 1") == 3
    # without probes (given clusters, --no-probe) the drift-corrected statistic is left out
    rows[0]["rounds"] = [rd(0.1, 0.08, 0.1)]
    for k in [k for k in rows[0] if k.endswith("drift-corrected") or k.endswith("drift-corrected_s")]:
        del rows[0][k]
    ca.combine_rounds(rows[0])
    assert ca.summary(rows, "drift-corrected") is None
    assert {v[0] for v in ca.VARIANTS} >= ca.QUICK and len(ca.QUICK) >= 6


def test_real_quick_case():
    pytest.importorskip("sapp.api")
    row = bench_run.run_case(bench_run.Searcher(), "gpt-tiny", 16, "a100-80g", 4, exhaustive=False)
    assert row["status"] == "ok" and row["sapp"]["step_s"] > 0
    s = row["sapp"]
    assert s["dp"] * s["tp"] * s["pp"] == 4
    for b in ("dp", "zero3", "megatron"):
        e = row[b]
        assert e["status"] == "ok" or e["status"] == "OOM" or e["status"].startswith("n/a")
        if e["status"] == "ok" and not e["idle_tp"]:
            # sapp searches a superset of every baseline's space with the same cost model, but for a tp
            # that shards nothing (replication), which the free search does not spend devices on
            assert e["speedup"] >= 1 - 1e-6


def test_invalid_prediction_is_flagged_not_ranked(tmp_path):
    class Negative(FakeSearch):
        def __call__(self, name, cluster, batch, constraints=None):
            plan = super().__call__(name, cluster, batch, constraints)
            if constraints:
                return plan
            d = plan.to_dict()
            d["predicted"]["step_time_s"] = -8.0
            return Plan(d)
    row = bench_run.run_case(Negative(), "gpt-test", 64, "a100-80g:gpus=2", 4, exhaustive=False)
    assert row["status"].startswith("invalid")
    assert all("speedup" not in row[b] for b in ("dp", "zero3", "megatron"))
    md = bench_run.to_markdown([row], "python -m bench", 1.0)
    assert "| invalid |" in md and "geometric mean" not in md


@pytest.mark.slow       # ~35 s: bench.paired_run's own machinery, `pytest -m slow`
def test_paired_run_alternates_the_plan_and_the_reference_block(tmp_path):
    # ~15 s (torchrun, 2 gloo processes): the --paired statistic rests on this worker's output
    pytest.importorskip("sapp.api")
    import sapp
    from bench.sapp_run import run_paired
    from sapp.api import search
    plan = search("gpt-tiny", sapp.Cluster.parse("cpu:gpus=2"), global_batch=8, constraints={"dp": 2})
    path = tmp_path / "plan.json"
    plan.save(path)
    res, status, wall = run_paired(path, "gpt-tiny", 2, 5, tmp_path / "res.json", timeout_s=150, rounds=2)
    assert status is None, status
    # (5 - 1) // 2 = 2 timed steps per round, one reference figure (a median of 7 steps) per round
    assert len(res["step_times_s"]) == 4 and len(res["reference_s"]) == 2
    assert all(t > 0 for t in res["step_times_s"] + res["reference_s"])
    assert res["reference_median_s"] == pytest.approx(sorted(res["reference_s"])[0] / 2 + sorted(res["reference_s"])[1] / 2)
    # a bad plan path ends in a one-line status, not an exception
    res, status, _ = run_paired(tmp_path / "missing.json", "gpt-tiny", 2, 5, tmp_path / "r2.json", timeout_s=150)
    assert res is None and status.startswith("paired run failed")


def test_results_md_stays_short():
    """bench/RESULTS.md holds today's figures, one short section per benchmark (command, date, machine,
    table), at most 600 lines (issue 56 item 6); derivations live in the docstring of the bench that
    produces them."""
    from bench import results
    with open(results.RESULTS) as f:
        n = sum(1 for _ in f)
    assert n <= 600, (f"bench/RESULTS.md has {n} lines (at most 600): shorten your section and move its "
                      f"derivation to the docstring of the bench that produces it")


def test_results_md_has_every_generated_section_and_replace_keeps_the_rest(tmp_path):
    """`python -m bench.results` rewrites only the marked bodies of bench/RESULTS.md, whose sections
    are numbered in order."""
    import re
    from bench import results
    doc = open(results.RESULTS).read()
    for name in results.SECTIONS:
        start, end = results.markers(name)
        assert doc.count(start) == 1 and doc.count(end) == 1 and doc.index(start) < doc.index(end), name
    numbers = [int(n) for n in re.findall(r"^## (\d+)\. ", doc, re.M)]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) == len(re.findall(r"^## ", doc, re.M))
    new = results.replace(doc, "zoo", "| fresh | table |")
    start, end = results.markers("zoo")
    assert new[new.index(start):new.index(end)] == start + "\n| fresh | table |\n"
    assert new[:new.index(start)] == doc[:doc.index(start)] and new[new.index(end):] == doc[doc.index(end):]
    with pytest.raises(ValueError, match="no generated section"):
        results.replace("# no markers\n", "zoo", "x")
    path = tmp_path / "R.md"
    path.write_text(doc)
    results.write("published", "body", path=str(path))
    assert results.markers("published")[0] + "\nbody\n" + results.markers("published")[1] in path.read_text()
