"""One engine table (issue 56 item 4): every engine is a row of sapp/search/targets.py naming its module,
versions, file and limits, and the CLI's choices, the search's limits and the import/export paths read
that row.  A toy engine added as one module (tests/engine_toy/toy.py) and one row is offered by
`--target`, searched within its limits, exported and imported back at the same price."""
import json

import pytest

from sapp.commands.cli import main
from sapp.search import targets


@pytest.fixture
def toy(monkeypatch):
    row = targets.Engine("toy", "Toy", "1.0", "tests.engine_toy.toy", "txt", ("eager",), schedules=("none",),
                         zero=(0,), sp="off", model_parallel=False, recompute=("none",), builds_model=False)
    monkeypatch.setitem(targets.ENGINES, "toy", row)
    return row


def test_the_engines_are_the_tables_rows():
    from sapp.search.constraints import TARGETS
    from sapp import engines
    assert list(TARGETS) == list(targets.ENGINES) == ["megatron", "torchtitan", "torchtitan@0.2.2", "deepspeed"]
    for name, row in targets.ENGINES.items():
        assert engines.get(name).__name__.endswith("." + row.module)
        assert TARGETS[name]["runtimes"] == row.runtimes


def test_a_toy_engine_is_one_module_and_one_row(toy, tmp_path, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    assert "toy (Toy 1.0, .txt)" in capsys.readouterr().out
    plan = tmp_path / "plan.json"
    assert main(["search", "--model", "gpt-tiny", "--cluster", "cpu:nodes=1", "--batch", "16", "--target", "toy",
                 "--out", str(plan), "--full"]) == 0
    d = json.loads(plan.read_text())
    assert d["parallel"]["tp"] == d["parallel"]["pp"] == 1 and d["zero"] == 0     # within the row's limits
    cfg = tmp_path / "toy.txt"
    assert main(["export", str(plan), "--to", "toy", "--out", str(cfg)]) == 0
    text = cfg.read_text()
    assert f"dp={d['parallel']['dp']}" in text and "global_batch=16" in text
    back = tmp_path / "back.json"
    assert main(["import", "--from", "toy", str(cfg), "--model", "gpt-tiny", "--cluster", "cpu:nodes=1",
                 "--out", str(back), "--full", "--no-compare"]) == 0
    again = json.loads(back.read_text())
    assert again["parallel"] == d["parallel"]
    assert again["predicted"]["step_time_s"] == pytest.approx(d["predicted"]["step_time_s"], rel=1e-3)
    capsys.readouterr()
    with pytest.raises(SystemExit):     # gone with its row
        targets.ENGINES.pop("toy")
        main(["export", str(plan), "--to", "toy"])
