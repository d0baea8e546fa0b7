"""A plan's operators map beside it (issue 55 item 8): `sapp search --out plan.json` writes the plan
without its operators (one entry per operator: 85% of a 175B plan's bytes) and PLAN.operators.json
beside it, named in the plan with its SHA-256; every reader (Plan.load, so every command) loads the
pair as the one plan `--full` writes in one file.  A side file that is not the one written with the
plan, missing, or named outside the plan's folder is refused in one line."""
import json
import os

import pytest

from sapp.commands.cli import main
from sapp.errors import PlanError
from sapp.plan import Plan, operators_path


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("ops")
    argv = ["search", "--model", "gpt-tiny", "--cluster", "cpu:nodes=1", "--batch", "16"]
    assert main(argv + ["--out", str(d / "plan.json")]) == 0
    assert main(argv + ["--out", str(d / "full.json"), "--full"]) == 0
    return d


def test_the_plan_and_its_operators_load_as_the_full_plan(pair):
    plan = json.loads((pair / "plan.json").read_text())
    side = json.loads((pair / "plan.operators.json").read_text())
    full = json.loads((pair / "full.json").read_text())
    assert "operators" not in plan and plan["operators_file"]["path"] == "plan.operators.json"
    assert side["operators"] == full["operators"] and len(full["operators"]) > 10
    assert not os.path.exists(operators_path(pair / "full.json"))         # --full: one file
    assert Plan.load(str(pair / "plan.json")) == Plan.load(str(pair / "full.json"))
    from sapp import schema
    assert schema.first_error("plan", plan) is None                        # the file as written is a plan
    assert os.path.getsize(pair / "plan.json") < 0.6 * os.path.getsize(pair / "full.json")


def test_commands_read_the_pair(pair, capsys):
    capsys.readouterr()
    assert main(["explain", str(pair / "plan.json")]) == 0
    a = capsys.readouterr().out
    assert main(["explain", str(pair / "full.json")]) == 0
    assert a == capsys.readouterr().out and "Plan for gpt-tiny" in a
    assert main(["diff", str(pair / "plan.json"), str(pair / "full.json")]) == 0


@pytest.mark.parametrize("case", ["edited", "missing", "outside", "dotdot", "no-folder"])
def test_a_side_file_that_is_not_the_plans_is_refused_in_one_line(pair, tmp_path, case):
    plan = json.loads((pair / "plan.json").read_text())
    side = (pair / "plan.operators.json").read_text()
    (tmp_path / "plan.operators.json").write_text(side)
    if case == "edited":        # another search's operators: the digest tells
        (tmp_path / "plan.operators.json").write_text(side.replace('"split"', '"split" ', 1))
    elif case == "missing":
        os.remove(tmp_path / "plan.operators.json")
    elif case == "outside":
        plan["operators_file"]["path"] = "/etc/passwd"
    elif case == "dotdot":
        plan["operators_file"]["path"] = "../plan.operators.json"
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(PlanError) as e:
        if case == "no-folder":
            Plan.from_json(json.dumps(plan))
        else:
            Plan.load(str(tmp_path / "plan.json"))
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 300 + 2 * len(str(tmp_path)), msg
    want = {"edited": "SHA-256 differs", "missing": "plan.operators.json", "outside": "file name beside the plan",
            "dotdot": "file name beside the plan", "no-folder": "Plan.load(path)"}[case]
    assert want in msg, msg


def test_a_symlink_planted_at_either_file_is_replaced_not_followed(pair, tmp_path):
    """Files are written never through a symlink: links planted at the plan's and its side file's names
    are replaced by the files, and what they point at is left as it was."""
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    for name in ("plan.json", "plan.operators.json"):
        os.symlink(victim, tmp_path / name)
    Plan.load(str(pair / "full.json")).save(str(tmp_path / "plan.json"), operators_beside=True)
    assert victim.read_text() == "mine"
    assert not os.path.islink(tmp_path / "plan.json") and not os.path.islink(tmp_path / "plan.operators.json")
    assert Plan.load(str(tmp_path / "plan.json")) == Plan.load(str(pair / "full.json"))


@pytest.mark.parametrize("cmd", ["export", "cluster", "mixed"])
def test_the_other_files_sapp_writes_replace_a_planted_symlink(tmp_path, cmd):
    """An engine configuration (`sapp export --out`), a cluster file (Cluster.save, what `sapp calibrate`
    writes) and a mixed cluster's plan (`sapp search --cluster A+B --out`) replace a symlink planted at
    their name; its target is left as it was."""
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    out = tmp_path / "out.file"
    os.symlink(victim, out)
    if cmd == "export":
        plan = tmp_path / "p.json"
        assert main(["search", "--model", "gpt-tiny", "--cluster", "cpu:nodes=1", "--batch", "16", "--out",
                     str(plan), "--full"]) == 0
        assert main(["export", str(plan), "--to", "deepspeed", "--out", str(out)]) == 0
    elif cmd == "cluster":
        from sapp.cluster import Cluster
        Cluster.parse("cpu:nodes=1").save(str(out))
    else:
        assert main(["search", "--model", "gpt-tiny", "--cluster", "cpu:nodes=1+cpu:gpus=1", "--batch", "16",
                     "--out", str(out)]) == 0
    assert victim.read_text() == "mine" and not os.path.islink(out) and out.stat().st_size > 10
