"""What a plan and `sapp search` say is true: the sequence-parallelism note only where sp was pinned,
per-device memory lines holding device memory only (a host placement's states on a line of their
own), and a stage label naming what the stage holds."""
from __future__ import annotations

import pytest

from sapp.api import search
from sapp.commands.search import summary
from sapp.units import fmt_bytes

PINNED_NOTE = "sequence parallelism was pinned"


@pytest.fixture(scope="module")
def wide_deep():
    """Wide&Deep 100M on one V100 node: tp=4 with SP priced free, the tables held on the host."""
    return search("wide-deep-100m", "v100-32g:nodes=1")


def test_no_pinned_sp_note_when_nothing_was_pinned(wide_deep):
    assert wide_deep.parallel["tp"] > 1 and not wide_deep.parallel.get("sp")
    assert not any(PINNED_NOTE in n for n in wide_deep.notes), wide_deep.notes


def test_pinned_sp_without_sp_ops_keeps_its_note():
    plan = search("wide-deep-100m", "v100-32g:nodes=1", constraints={"sp": True, "tp": 4})
    assert not plan.parallel.get("sp")
    assert any(PINNED_NOTE in n for n in plan.notes), plan.notes


def test_per_device_memory_lines_hold_device_memory_only(wide_deep):
    d = wide_deep.to_dict()
    pr, host = d["predicted"], d["placement"]["predicted"]["saved_bytes"]
    assert host > 1e9 and pr["peak_memory_bytes"] < 1e8          # tens of GB of tables on the host
    device_states = pr["peak_memory_bytes"] - pr["memory"]["activations"] - pr["memory"]["transient"]
    text = summary(wide_deep)
    mem = next(x for x in text.splitlines() if x.startswith("memory "))
    assert f"model states {fmt_bytes(device_states)}" in mem, mem
    for k in ("optimizer", "params", "grads"):                 # the whole states' figures are not device memory
        assert f"{k} {fmt_bytes(pr['memory'][k])}" not in mem, mem
    host_line = next(x for x in text.splitlines() if x.startswith("host "))
    assert fmt_bytes(host) in host_line and "embedding-host" in host_line, host_line
    zero = next(n for n in wide_deep.notes if n.startswith("ZeRO-"))
    assert f"model states per device {fmt_bytes(device_states)} on the device" in zero, zero
    assert f"{fmt_bytes(host)} more per device held in host memory" in zero, zero


def test_explain_memory_table_holds_device_memory_only(wide_deep):
    from sapp.report.explain import explain
    d = wide_deep.to_dict()
    text = explain(wide_deep)
    table = text[text.index("Memory per device"):text.index("Binding constraint")]
    assert fmt_bytes(d["predicted"]["memory"]["optimizer"]) not in table, table
    assert "host memory: up to " + fmt_bytes(d["placement"]["predicted"]["saved_bytes"]) in table, table


def _stage_labels(plan):
    rows = summary(plan).splitlines()
    i = next(k for k, x in enumerate(rows) if x.lstrip().startswith("stage"))
    out = []
    for x in rows[i + 1:]:
        if not x[:5].strip().isdigit():
            break
        out.append(" ".join(x.split()[1:-8]))      # index, label, then 4 figures with their units
    return out


def test_stage_labels_name_what_the_stage_holds():
    """ResNet's blocks sit in four lists: one stage holds them all (and the stem and head), a stage
    of a pipeline names its first and last block in full when they are in different lists."""
    one = search("resnet-tiny", "a100-80g:nodes=1,gpus=1", global_batch=8)
    assert _stage_labels(one) == ["whole model"], summary(one)
    two = search("resnet-tiny", "a100-80g:nodes=1,gpus=2", global_batch=8, constraints={"pp": 2, "dp": 1})
    labels = _stage_labels(two)
    blocks = [s["blocks"] for s in sorted(two.pipeline["stages"], key=lambda s: s["index"])]
    assert len(labels) == 2
    for lab, bl in zip(labels, blocks):
        assert lab.startswith(bl[0]) and lab.endswith(bl[-1] if len(bl) > 1 else bl[0]), (lab, bl)
