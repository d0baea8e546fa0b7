"""The truth matrix's step-time columns (bench/truth_matrix.py): Spearman's rank correlation against
scipy's, and one row per plan at its slowest rank's median step."""
import pytest

from bench import truth_matrix as tm


def test_spearman_matches_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    xs = [0.1, 0.4, 0.4, 0.2, 0.9, 0.3, 0.7]
    ys = [1.0, 3.0, 2.0, 2.0, 9.0, 0.5, 4.0]
    assert tm.spearman(xs, ys) == pytest.approx(float(stats.spearmanr(xs, ys).statistic))
    assert tm.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_time_rows_take_the_slowest_rank_and_skip_unmeasured():
    base = {"refused": None, "error": None, "predicted_step_s": 0.1}
    rs = [dict(base, id="a", rank=0, step_s=[0.10, 0.12, 0.30], cpu_s=[0.05, 0.05, 0.06]),
          dict(base, id="a", rank=1, step_s=[0.15, 0.14, 0.13], cpu_s=[0.07, 0.08, 0.09]),
          dict(base, id="b", rank=0, step_s=[], cpu_s=[]),
          {"id": "c", "rank": None, "refused": "InfeasibleError: ..."}]
    (a,) = tm.time_rows(rs)
    assert a["id"] == "a" and a["measured_s"] == pytest.approx(0.14) and a["cpu_s"] == pytest.approx(0.08)
    assert a["rel_err"] == pytest.approx(0.4)
    assert "Spearman" in tm.time_summary([a, dict(a, id="d", predicted_s=0.2, measured_s=0.3),
                                          dict(a, id="e", predicted_s=0.3, measured_s=0.5)], calibrated=False)
