"""bench/published.py: the rows registry is consistent (each pinned configuration uses exactly the row's
devices), other modules' rows are picked up, and one published figure is reproduced: Korthikanti 2022
Table 4's 22B layer at t=8 (19.6 ms forward + backward, no recomputation) within ±10% under the fused
runtime profile.  Two small captures and pinned searches: ~20 s."""
import sys
import types

import pytest

from bench import published
from sapp.cluster import Cluster
from sapp.costmodel import CostSettings


def test_rows_pin_the_published_degrees():
    assert len(published.ROWS) >= 9 + 3 + 6
    for r in published.ROWS:
        p = r.pins
        assert p["tp"] * p["pp"] * p["dp"] == Cluster.parse(r.cluster).devices, r.name
        assert r.metric in published._UNITS and r.published > 0


def test_extra_row_modules_are_imported(monkeypatch):
    row = published.Row("g", "extra", "gpt-tiny", {}, "cpu:gpus=1", 4, {"tp": 1, "pp": 1, "dp": 1}, "layer_ms", 1.0, "x")
    monkeypatch.setitem(sys.modules, "bench.published_sp", types.SimpleNamespace(ROWS=[row]))
    assert published._extra_rows()[-1] is row


def test_megatron_flops_formula():
    cfg = {"l": 96, "h": 12288, "s": 2048, "V": 51200}
    # REFERENCE §2 at B=1536: 72·B·s·l·h²·(1 + s/6h + V/12lh)
    want = 72 * 1536 * 2048 * 96 * 12288 ** 2 * (1 + 2048 / (6 * 12288) + 51200 / (12 * 96 * 12288))
    assert published.gpt_flops_per_step(cfg, 1536) == pytest.approx(want, rel=1e-12)


def test_korthikanti_layer_time_within_ten_percent():
    row = next(r for r in published.ROWS if r.name == "22B layer t8 no recompute")
    got = published.price(row, CostSettings(runtime="fused"), {})
    assert not got.error
    assert abs(got.value / row.published - 1) <= 0.10, got.value
