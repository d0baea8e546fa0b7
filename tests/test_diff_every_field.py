"""`sapp diff` names every field that changes a plan's price: each degree (cp, ep and sp too), the
runtime profile, precision, optimizer, recomputation block by block, and one aligned row per stage's
memory."""
import copy
import json

import pytest

from sapp import Plan
from sapp.report import diff


@pytest.fixture(scope="module")
def plan():
    import sapp
    return sapp.search("gpt-small", "a100-80g:nodes=1", global_batch=32, constraints={"pp": 2})


def _rows(text):
    """{field: its line} of the diff's table (the field column ends where column A's header starts)."""
    lines = text.splitlines()
    w0 = lines[0].index("  A ")
    out = {}
    for line in lines[2:]:
        if not line.strip():
            break
        out[line[:w0].strip()] = line
    return out


@pytest.mark.parametrize("edit, field", [
    (lambda d: (d["parallel"].update(cp=2, dp=d["parallel"]["dp"] // 2),
                d["pipeline"].update(micro_batch_size=2 * d["pipeline"]["micro_batch_size"])), "cp"),
    (lambda d: d["parallel"].update(ep=2), "ep"),
    (lambda d: d["parallel"].update(sp=True), "sp"),
    (lambda d: d["settings"].update(runtime="fused"), "settings.runtime"),
    (lambda d: d["settings"].update(precision="fp32"), "settings.precision"),
    (lambda d: d["settings"].update(optimizer="sgd"), "settings.optimizer"),
    (lambda d: d["recompute"]["blocks"].update({"h.0": "full"}), "recompute by block"),
])
def test_each_price_field_is_shown_when_it_differs(plan, edit, field):
    a = plan.to_dict()
    b = copy.deepcopy(a)
    edit(b)
    text = diff(a, b)
    line = _rows(text).get(field)
    assert line is not None and "*" in line, (field, text)
    same = _rows(diff(a, copy.deepcopy(a)))
    assert field == "recompute by block" and field not in same or "*" not in same[field]


def test_stage_memory_rows_are_aligned_one_per_stage(plan):
    a = plan.to_dict()
    b = copy.deepcopy(a)
    b["pipeline"]["stages"][1]["predicted"]["memory_bytes"] *= 2
    text = diff(a, b)
    rows = _rows(text)
    assert "stage 0 memory" in rows and "stage 1 memory" in rows, text
    col = text.splitlines()[0].index("  A ") + 2
    for k in ("stage 0 memory", "stage 1 memory"):      # each value starts in column A, not in one joined string
        assert rows[k][col - 1] == " " and rows[k][col] != " ", rows[k]
    assert "*" in rows["stage 1 memory"] and "*" not in rows["stage 0 memory"]
