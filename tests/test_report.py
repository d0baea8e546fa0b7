"""explain / diff / plot / progress on fabricated plans (and zoo plans once sapp.search exists)."""
import io
import json

import pytest

from sapp import Cluster, Plan
from sapp.errors import PlanError, SappError
from sapp.report import Progress, diff, explain, plan_timeline, plot, simulate_schedule
from sapp.report.explain import binding_constraint


def make_plan(dp=2, tp=2, pp=4, m=8, schedule="1f1b", recompute="none", zero=0, mem_frac=0.5,
              fwd=0.01, v=1, host=False, alternatives=True):
    """A plausible plan dict following docs/ARCHITECTURE.md's schema."""
    cl = Cluster.parse("a100-80g:nodes=2")
    cap = cl.device_memory
    stages = []
    for i in range(pp):
        act = cap * mem_frac * 0.4 * (pp - i) / pp
        mem = {"params": cap * mem_frac * 0.15, "grads": cap * mem_frac * 0.15, "optimizer": cap * mem_frac * 0.3,
               "activations": act}
        stages.append({"index": i, "blocks": [f"layers.{2 * i}", f"layers.{2 * i + 1}"],
                       "devices": [i * dp * tp, (i + 1) * dp * tp],
                       "predicted": {"fwd_s": fwd * (1.1 if i == 0 else 1.0), "bwd_s": 2 * fwd,
                                     "recompute_s": fwd if recompute == "full" else 0.0,
                                     "p2p_s": fwd / 20, "grad_sync_s": fwd / 2,
                                     "memory_bytes": sum(mem.values()), "memory": mem}})
    operators = {}
    for i in range(2 * pp):
        operators[f"fc1_{i}"] = {"split": ["b0", "n"] if tp > 1 else ["b0", None], "out": ["S(0)", "S(2)"],
                                 "module": f"layers.{i}.mlp.fc1", "kind": "matmul"}
        operators[f"fc2_{i}"] = {"split": ["b0", "k"] if tp > 1 else ["b0", None], "out": ["S(0)", "P"],
                                 "module": f"layers.{i}.mlp.fc2", "kind": "matmul"}
    step = (m + pp - 1) * 3.1 * fwd
    d = {
        "schema": "sapp.plan/1",
        "model": {"name": "gpt-test", "fingerprint": "abc123", "params": 1.3e9,
                  # 64 samples, or one a micro-batch when dp x m is more (a batch the fields make up)
                  "global_batch": dp * m * max(1, 64 // (dp * m))},
        "cluster": cl.to_dict(), "devices": dp * tp * pp, "parallel": {"dp": dp, "tp": tp, "pp": pp},
        "mesh": {"levels": [{"size": 2, "link": "intra"}, {"size": 2, "link": "intra"}]},
        "operators": operators,
        "tp_modules": {f"layers.{i}.mlp.fc1": "colwise" for i in range(2 * pp)} if tp > 1 else {},
        "pipeline": {"schedule": schedule, "micro_batches": m, "micro_batch_size": max(1, 64 // (dp * m)),
                     "virtual_chunks": v, "stages": stages},
        "recompute": {"default": recompute, "blocks": {}},
        "zero": zero,
        "placement": {"groups": {"embedding.weight": {"weights": "host", "grads": "host", "optimizer": "host"}} if host else {},
                      "predicted": {"host_s": fwd if host else 0.0}},
        "constraints": {"pp": pp},
        "predicted": {"step_time_s": step, "peak_memory_bytes": stages[0]["predicted"]["memory_bytes"], "mfu": 0.41,
                      "compute_s": m * 3 * fwd, "comm_s": 0.05 * step, "bubble_s": (pp - 1) * 3 * fwd, "host_s": 0.0,
                      "comm_by_kind": {"tp": 0.03 * step, "dp_grad_sync": 0.02 * step},
                      "memory": stages[0]["predicted"]["memory"]},
        "notes": ["pp=4 keeps the optimizer state of 1.3B params in memory"],
    }
    if alternatives:
        d["alternatives"] = [
            {"parallel": {"dp": dp * 2, "tp": tp, "pp": pp // 2}, "schedule": schedule, "micro_batches": m,
             "recompute": "full", "zero": 1, "predicted": {"step_time_s": step * 1.07, "peak_memory_bytes": cap * 0.8},
             "reason": "needs full recompute to fit"},
            {"parallel": {"dp": dp, "tp": tp * 2, "pp": pp // 2}, "schedule": schedule, "micro_batches": m,
             "predicted": {"step_time_s": step * 1.2}, "feasible": True},
        ]
    return d


def test_explain_sections():
    text = explain(Plan(make_plan()))
    for needle in ("dp=2 tp=2 pp=4", "Step time", "compute", "communication", "pipeline bubble", "host work",
                   "comm tp", "Memory per device", "activations", "Binding constraint", "Next-best alternatives",
                   "+7.0%", "needs full recompute", "Notes", "pinned by user: pp=4", "throughput"):
        assert needle in text, needle
    # one memory row per stage
    assert sum(1 for line in text.splitlines() if line.strip().startswith(("0 ", "1 ", "2 ", "3 "))) == 4


def test_explain_comm_kinds_from_grad_sync_and_p2p():
    d = make_plan(tp=2)
    del d["predicted"]["comm_by_kind"]
    d["predicted"].update(grad_sync_s=0.01, p2p_s=0.004, comm_s=0.014)
    text = explain(d)
    assert "comm dp sync" in text and "comm pp p2p" in text
    assert "compute includes the tensor-parallel collectives" in text
    assert "tensor-parallel collectives" not in explain(make_plan(tp=2))      # split out: no caveat


def test_explain_binding_constraint_memory_vs_time():
    assert binding_constraint(Plan(make_plan(mem_frac=0.99)))[0] == "memory"
    name, why = binding_constraint(Plan(make_plan(mem_frac=0.3, pp=4, m=2)))
    assert name in ("compute", "bubble") and "%" in why
    # fewer micro-batches on many stages make the bubble grow relative to compute
    assert binding_constraint(Plan(make_plan(mem_frac=0.3, pp=8, m=1)))[0] == "bubble"


def test_explain_minimal_plan_without_optional_fields():
    d = make_plan(pp=1, alternatives=False)
    d["pipeline"] = {"schedule": "none", "micro_batches": 1}
    del d["notes"], d["tp_modules"], d["constraints"]
    text = explain(d)
    assert "Binding constraint" in text and "alternatives" not in text


def test_diff_fields_ratios_and_layouts():
    a = Plan(make_plan(dp=2, tp=2, pp=4))
    b_d = make_plan(dp=4, tp=1, pp=4, zero=1, recompute="full")
    b_d["predicted"]["step_time_s"] = a["predicted"]["step_time_s"] * 2
    text = diff(a, Plan(b_d), names=("tp2", "dp4"))
    lines = {ln.split()[0]: ln for ln in text.splitlines() if ln.strip()}
    assert "x2.000" in lines["dp"] and "x0.500" in lines["tp"]
    assert "*" in lines["zero"] and "*" in lines["recompute"]
    step = next(ln for ln in text.splitlines() if ln.startswith("step time"))
    assert "x2.000" in step
    assert "16 of 16 shared operators differ" in text
    assert "matmul" in text and "{b0/2,n/2} -> {b0/2}" in text
    same = diff(a, a)
    assert "0 of 16 shared operators differ" in same and "*" not in same.split("Operator layouts")[0]


def test_simulator_matches_pipeline_formula():
    # (m + p - 1)(tf + tb) for GPipe and 1F1B; interleaving divides the bubble by v.
    for sched in ("gpipe", "1f1b"):
        _, t = simulate_schedule([1.0] * 4, [2.0] * 4, 8, sched)
        assert t == pytest.approx(11 * 3)
    _, t = simulate_schedule([0.5] * 8, [1.0] * 8, 8, "interleaved", virtual_chunks=2)
    assert t == pytest.approx(8 * 3 + 3 * 3 / 2)
    ev, t = simulate_schedule([1.0], [2.0], 3, "none", recompute_s=[1.0])
    assert t == pytest.approx(9) and sum(e.kind == "recompute" for e in ev) == 3
    # 1F1B keeps at most p - i micro-batches in flight on stage i
    ev, _ = simulate_schedule([1.0] * 4, [2.0] * 4, 8, "1f1b")
    for i in range(4):
        evs = sorted((e for e in ev if e.stage == i), key=lambda e: e.start)
        inflight = peak = 0
        for e in evs:
            inflight += 1 if e.kind == "fwd" else -1
            peak = max(peak, inflight)
        assert peak == 4 - i
    with pytest.raises(PlanError):
        simulate_schedule([1.0] * 2, [2.0] * 2, 4, "zigzag")


def test_plan_timeline_kinds():
    ev = plan_timeline(make_plan(recompute="full", host=True), use_team_simulator=False)
    kinds = {e.kind for e in ev}
    assert {"fwd", "bwd", "recompute", "comm", "sync", "host"} <= kinds
    assert all(e.end >= e.start for e in ev)


def _png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_plot_png_size(tmp_path):
    out = tmp_path / "plan.png"
    plot(make_plan(recompute="full"), out, width=900, height=600)
    assert out.stat().st_size > 10_000
    assert _png_size(out) == (900, 600)
    # explicit timeline and the interleaved schedule also draw
    out2 = tmp_path / "inter.png"
    plot(make_plan(schedule="interleaved", v=2), out2, timeline=[(0, 0, "fwd", 0.0, 1.0), (1, 0, "forward", 1.0, 2.0)],
         width=400, height=300)
    assert _png_size(out2) == (400, 300)
    with pytest.raises(SappError):
        plot(make_plan(), tmp_path / "x.png", width=10, height=10)


def test_cli_explain_diff_plot(tmp_path, capsys):
    from sapp.commands.cli import main
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    Plan(make_plan()).save(a)
    Plan(make_plan(dp=4, tp=1)).save(b)
    assert main(["explain", str(a)]) == 0
    assert "Binding constraint" in capsys.readouterr().out
    assert main(["diff", str(a), str(b)]) == 0
    assert "x2.000" in capsys.readouterr().out
    png = tmp_path / "p.png"
    assert main(["plot", str(a), "--out", str(png), "--width", "640", "--height", "480"]) == 0
    assert _png_size(png) == (640, 480)
    assert main(["explain", str(tmp_path / "missing.json")]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "other"}))
    assert main(["diff", str(a), str(bad)]) == 2
    assert "error" in capsys.readouterr().err


def test_progress_silent_off_tty_and_draws_on_tty():
    s = io.StringIO()
    with Progress(10, "search", stream=s) as p:
        for _ in range(10):
            p.update()
    assert s.getvalue() == ""           # StringIO is not a TTY

    class Tty(io.StringIO):
        def isatty(self):
            return True
    t = Tty()
    p = Progress(4, "search", stream=t, min_interval=0)
    for i in range(4):
        p.update(note=f"best {i}")
    p.close()
    p.close()                            # idempotent
    out = t.getvalue()
    assert "search: [####################] 4/4 100%" in out and "best 3" in out and out.endswith("\n")
    q = Progress(None, "open", stream=Tty(), min_interval=0)
    q.update(3)
    assert "3 done" in q.line()


def test_progress_as_callback():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    t = Tty()
    with Progress(label="joint", stream=t, min_interval=0) as p:
        p(3, 10)
        p(7, 10)
    assert p.count == 7 and p.total == 10 and "7/10" in t.getvalue()


def test_team_simulator_agrees_with_local_one():
    d = make_plan(recompute="full")
    for st in d["pipeline"]["stages"]:
        st["predicted"]["p2p_s"] = 0.0
    team = plan_timeline(d)
    local = plan_timeline(d, use_team_simulator=False)
    assert max(e.end for e in team) == pytest.approx(max(e.end for e in local))
    assert sorted((e.stage, e.micro_batch, e.kind) for e in team) == sorted((e.stage, e.micro_batch, e.kind) for e in local)


def test_progress_closes_on_interrupt():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    t = Tty()
    with pytest.raises(KeyboardInterrupt):
        with Progress(100, "search", stream=t, min_interval=0) as p:
            p.update(5)
            raise KeyboardInterrupt
    assert t.getvalue().endswith("\n") and "5/100" in t.getvalue()


def test_zoo_plans_explain_diff_plot(tmp_path):
    api = pytest.importorskip("sapp.api")
    cl = Cluster.parse("a100-80g:devices=8")
    graph, _ = api.capture_graph(api.resolve_model("gpt-small")[0])
    best = api.search("gpt-small", cl, global_batch=32, graph=graph)
    pinned = api.search("gpt-small", cl, global_batch=32, graph=graph,
                        constraints={"dp": 2, "tp": 2, "pp": 2, "schedule": "1f1b"})
    text = explain(best)
    assert "Step time" in text and "Binding constraint" in text
    d = diff(best, pinned)
    assert "step time" in d and "Operator layouts" in d
    out = tmp_path / "zoo.png"
    plot(pinned, out, width=800, height=500)
    assert _png_size(out) == (800, 500)
    # the timeline's makespan is within the pipeline part of the predicted step
    ev = plan_timeline(pinned)
    assert {e.stage for e in ev} == {0, 1}
    assert max(e.end for e in ev) <= pinned["predicted"]["step_time_s"] * 1.05
