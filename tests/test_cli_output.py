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
    from sapp.cli import main
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
    from sapp.cli import main
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["search", "--model", "gpt-tiny", "--cluster", "cpu:gpus=2"]) == 0
    frames = [f for f in "".join(tty.parts).split("\r\x1b[K") if f]
    assert frames[0].startswith("search: ") and "importing torch" in frames[0]
    assert "capturing gpt-tiny" in frames[1]
    assert "[####################] 100%" in frames[-1] and "/1000" not in frames[-1]
    assert "predicted step" in capsys.readouterr().out
