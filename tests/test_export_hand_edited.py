"""`sapp export` of a plan whose model section was hand-edited into something sapp never writes
(issue 53, finding 6: `model.meta.config` a string gave a ValueError traceback from
sapp/engines/arch.py): one line naming the section, exit 2, nothing written."""
import copy
import json

import pytest

from sapp.commands.cli import main


@pytest.fixture(scope="module")
def plan_doc():
    from sapp.api import search
    return json.loads(search("gpt-tiny", "cpu:gpus=2", global_batch=8).to_json())


def _edit(doc, how):
    d = copy.deepcopy(doc)
    how(d["model"]["meta"])
    return d


EDITS = {
    "config a string": lambda m: m.update(config="oops"),
    "config a list": lambda m: m.update(config=[1, 2]),
    "config lacks the hidden size": lambda m: m["config"].pop("h"),
    "hidden size a string": lambda m: m["config"].update(h="64"),
    "no heads": lambda m: m["config"].update(a=0),
}


@pytest.mark.parametrize("what", sorted(EDITS))
def test_hand_edited_model_section_is_one_line(plan_doc, tmp_path, capsys, what):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_edit(plan_doc, EDITS[what])))
    rc = main(["export", str(path), "--to", "megatron", "--out", str(tmp_path / "args.sh")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "model.meta" in err or "plan" in err, err
    assert not (tmp_path / "args.sh").exists()


def test_the_plan_as_written_still_exports(plan_doc, tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_doc))
    assert main(["export", str(path), "--to", "megatron", "--out", str(tmp_path / "args.sh")]) == 0, capsys.readouterr()
    assert "--hidden-size 64" in (tmp_path / "args.sh").read_text()
