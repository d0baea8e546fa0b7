"""What the CLI prints reads at any scale: counts and rates in human units, an interleaved plan's
summary grouped by stage with its virtual chunks named as chunks."""
import copy

from sapp import Plan
from sapp.commands.search import summary
from sapp.units import fmt_count, fmt_flops, fmt_time
from tests.test_report import make_plan


def test_counts_and_rates_in_human_units():
    assert [fmt_count(n) for n in (135, 135_000, 1_300_000, 175e9, 1.2e12)] == ["135", "135 K", "1.3 M", "175 B", "1.2 T"]
    assert [fmt_flops(f) for f in (50e9, 312e12, 1.5e15, 2e5)] == ["50 GFLOP/s", "312 TFLOP/s", "1.5 PFLOP/s", "200000 FLOP/s"]


def test_clusters_table_shows_the_cpu_preset_in_gflops(capsys):
    from sapp.commands.cli import main
    assert main(["clusters"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert "50 GFLOP/s" in rows["cpu"] and "312 TFLOP/s" in rows["a100-80g"] and " 0 " not in rows["cpu"]


def test_summary_names_params_and_groups_virtual_chunks_by_stage():
    d = make_plan(pp=2, schedule="interleaved", v=3)
    d["model"]["params"] = 135_000
    chunks = []
    for c in range(6):             # 6 virtual chunks of one block, chunk c on stage c % 2
        s = copy.deepcopy(d["pipeline"]["stages"][c % 2])
        s.update(index=c, device_stage=c % 2, blocks=[f"layers.{c}"])
        s["predicted"]["fwd_s"] = 0.001 * (c + 1)
        chunks.append(s)
    d["pipeline"]["stages"] = chunks
    text = summary(Plan(d))
    assert "(135 K params)" in text.splitlines()[0] and "0.000135" not in text
    assert "6 virtual chunks: 3 per stage on 2 stages" in text
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert [r[0] for r in rows] == ["0", "1"]                       # one row per stage, not per chunk
    assert rows[0][1:5] == ["3", "in", "3", "chunks"]
    assert rows[0][5:7] == ["9.00", "ms"] and rows[1][5:7] == ["12.00", "ms"]    # 1+3+5 and 2+4+6 ms of forward
    plain = summary(Plan(make_plan(pp=2)))
    assert "virtual chunks" not in plain and "layers.0..1" in plain


class _Tty:
    """A terminal stand-in: Progress draws only on a TTY."""
    def __init__(self):
        self.parts = []

    def write(self, s):
        self.parts.append(s)

    def flush(self):
        pass

    def isatty(self):
        return True


def test_search_progress_is_the_bound_gap_and_ends_at_100_percent():
    """The joint search reports thousandths of its work (the gap closed between the lower bound and the
    best step found), never going back, ending at 1000; a two-argument callback still works."""
    from sapp import api
    graph, _ = api.capture_graph(api.resolve_model("gpt-small")[0])
    seen, notes = [], []
    plan = api.search("gpt-small", "a100-80g:devices=16", global_batch=32, graph=graph,
                      progress=lambda done, total, note: (seen.append((done, total)), notes.append(note)))
    assert {t for _, t in seen} == {1000} and seen[-1][0] == 1000
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:])) and len(seen) > 3
    assert any(0 < d < 1000 for d, _ in seen)                   # it moves between start and end
    assert "configurations" in notes[0] and f"best {fmt_time(plan.predicted['step_time_s'])}" in notes[-1]
    two = []
    api.search("gpt-small", "a100-80g:devices=16", global_batch=32, graph=graph, progress=lambda d, t: two.append(d))
    assert two[-1] == 1000 and [d for d, _ in seen] == two


def test_search_command_says_what_it_does_before_capturing(monkeypatch, capsys):
    import sys
    from sapp.commands.cli import main
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["search", "--model", "gpt-tiny", "--cluster", "cpu:gpus=2"]) == 0
    frames = [f for f in "".join(tty.parts).split("\r\x1b[K") if f]
    assert frames[0].startswith("search: ") and "importing torch" in frames[0]
    assert "capturing gpt-tiny" in frames[1]
    assert "[####################] 100%" in frames[-1] and "/1000" not in frames[-1]
    assert "predicted step" in capsys.readouterr().out


def _interleaved_plan(m, v=3, pp=2, sync=0.004):
    """make_plan's stages as pp·v virtual chunks, without per-chunk gradient sync (as api.build_plan
    writes an interleaved plan); the step's sync in predicted.grad_sync_s."""
    d = make_plan(pp=pp, m=m, schedule="interleaved", v=v)
    chunks = []
    for c in range(pp * v):
        s = copy.deepcopy(d["pipeline"]["stages"][c % pp])
        pr = s["predicted"]
        s.update(index=c, device_stage=c % pp, blocks=[f"layers.{c}"],
                 predicted={"fwd_s": pr["fwd_s"] / v, "bwd_s": pr["bwd_s"] / v, "memory_bytes": pr["memory_bytes"],
                            "memory": pr["memory"]})
        chunks.append(s)
    d["pipeline"]["stages"] = chunks
    d["predicted"]["grad_sync_s"] = sync
    return d


def test_interleaved_timeline_shows_the_gradient_sync_on_every_stage():
    from sapp.report import plan_timeline
    ev = plan_timeline(_interleaved_plan(m=4))
    sync = [e for e in ev if e.kind == "sync"]
    assert sorted(e.stage for e in sync) == [0, 1] and all(abs(e.duration - 0.004) < 1e-12 for e in sync)
    for e in sync:                              # after the stage's last backward
        assert e.start >= max(x.end for x in ev if x.stage == e.stage and x.kind == "bwd") - 1e-12


def test_gantt_draws_every_box_zooms_on_a_long_schedule_and_memory_axis_follows_the_data():
    """48 micro-batches x 6 chunks: every box is drawn (alternate micro-batches shaded, so each reads
    and the bubble stays white) and a zoom on the warm-up carries the micro-batch numbers."""
    import pytest
    pytest.importorskip("matplotlib")
    from sapp.report.plot import MAX_BOXES_PER_ROW, _gantt, _memory, _pyplot, dense, warm_up_end
    from sapp.report import plan_timeline
    plt = _pyplot()
    small, big = _interleaved_plan(m=4), _interleaved_plan(m=48, v=6)
    for d, crowded in ((small, False), (big, True)):
        ev = plan_timeline(d)
        boxes = sum(1 for e in ev if e.stage == 0 and e.micro_batch >= 0 and e.kind in ("fwd", "bwd"))
        assert (boxes > MAX_BOXES_PER_ROW) == crowded == dense(ev)
        fig, ax = plt.subplots()
        _gantt(ax, Plan(d), ev, 2)
        drawn = len(ax.patches) + sum(len(c.get_paths()) for c in ax.collections)
        assert drawn >= sum(1 for e in ev if e.duration > 0)          # no box merged into an area
        assert ("alternate micro-batches shaded" in ax.get_title(loc="left")) == crowded
        assert "gradient sync" in [t.get_text() for t in ax.get_legend().get_texts()]
        plt.close(fig)
        if crowded:
            fig, ax = plt.subplots()
            _gantt(ax, Plan(d), ev, 2, xlim=warm_up_end(ev), zoom=True)
            numbers = [t.get_text() for t in ax.texts]
            assert "0" in numbers and ax.get_xlim()[1] < 0.5 * max(e.end for e in ev)
            plt.close(fig)
    tiny = make_plan(pp=2)
    for st in tiny["pipeline"]["stages"]:        # a few MB on an 80 GB device
        st["predicted"]["memory"] = {k: v * 1e-4 for k, v in st["predicted"]["memory"].items()}
        st["predicted"]["memory_bytes"] = sum(st["predicted"]["memory"].values())
    fig, ax = plt.subplots()
    _memory(ax, Plan(tiny))
    peak = max(st["predicted"]["memory_bytes"] for st in tiny["pipeline"]["stages"])
    assert ax.get_ylabel() == "MB per device" and peak / 1e6 <= ax.get_ylim()[1] <= 1.1 * peak / 1e6
    assert "capacity" in ax.get_title()
    plt.close(fig)
    fig, ax = plt.subplots()
    _memory(ax, Plan(make_plan(pp=2, mem_frac=0.9)))     # near capacity: the capacity line is on the axis
    assert ax.get_ylabel() == "GB per device" and any("capacity" in t.get_text() for t in ax.get_legend().get_texts())
    plt.close(fig)


def test_the_drawn_step_ends_at_the_prediction():
    """What the chart draws sums to the predicted step: the schedule, the gradient sync, host work and
    the rest of the exposed communication (a ResNet's batch-norm statistics) and the optimizer update."""
    import sapp
    from sapp.report import plan_timeline
    from sapp.report.timeline import rest_parts
    for model, cluster, pins in (("resnet50", "v100-32g:nodes=1", {}), ("gpt-small", "a100-80g:nodes=1", {"pp": 2}),
                                 ("gpt3-175b", "a100-80g:nodes=128", {})):
        plan = sapp.search(model, cluster, constraints=pins)
        ev = plan_timeline(plan)
        step = plan["predicted"]["step_time_s"]
        end = max(e.end for e in ev)
        assert abs(end - step) <= 0.01 * step, (model, end, step)
        if model == "resnet50":
            assert "batch_stats_sync" in rest_parts(plan) and any(e.kind == "exposed" for e in ev)
