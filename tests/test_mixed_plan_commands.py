"""A mixed-cluster plan (`sapp search --cluster A+B`) through every command that reads a plan (issue 55
item 1): explain and plot show each group, diff compares it with a plain plan, evaluate re-prices it,
replan re-plans it, export refuses it in one line with the real reason; every command reads plans
through sapp.plan.load_any, and a schema it does not read is refused in one line saying how to get one.
A mixed plan is an ordinary plan with a `groups` section, one Plan type and one schema; files written
in the earlier sapp.hetero-plan/1 layout are migrated on read."""
import json

import pytest

from sapp.commands.cli import main
from sapp.errors import PlanError

MIXED = "a100-80g:nodes=1+h100-80g:nodes=1"


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """gpt3-125m at batch 64: data mode (both groups get a share), gpt-small in pipeline mode, and the
    plain plan of gpt3-125m on two H100 nodes."""
    import sapp
    from sapp.api import mixed as hetero_plan
    from sapp.cluster.groups import parse
    d = tmp_path_factory.mktemp("mixed")
    data, _ = hetero_plan.search("gpt3-125m", parse(MIXED), global_batch=64, mode="data")
    pipe, _ = hetero_plan.search("gpt-small", parse(MIXED), global_batch=256, mode="pipeline")
    assert [g["batch_share"] > 0 for g in data["groups"]["members"]] == [True, True]
    (d / "data.json").write_text(hetero_plan.dumps(data))
    (d / "pipe.json").write_text(hetero_plan.dumps(pipe))
    sapp.search("gpt3-125m", "h100-80g:nodes=2", global_batch=64).save(str(d / "plain.json"))
    return {k: str(d / f"{k}.json") for k in ("data", "pipe", "plain")} | {"data_doc": data, "pipe_doc": pipe,
                                                                           "dir": d}


def _cli(capsys, *argv):
    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_load_any_tells_the_kinds_apart_and_refuses_other_schemas_in_one_line(plans, tmp_path):
    from sapp.plan import Plan, load_any
    assert load_any(plans["data"])[0] == "mixed" and load_any(plans["pipe"])[0] == "mixed"
    kind, plan = load_any(plans["plain"])
    assert kind == "plan" and isinstance(plan, Plan) and not plan.mixed
    for k in ("data", "pipe"):                      # one Plan type: the API's Plan.load reads both kinds
        mixed = Plan.load(plans[k])
        assert mixed.mixed and mixed["schema"] == plan["schema"] == "sapp.plan/1"
        assert sorted(g["name"] for g in mixed.groups["members"]) == ["a100-80g", "h100-80g"]
    old = json.loads(open(plans["plain"]).read())
    old["schema"] = "sapp.plan/0"
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(PlanError) as e:
        load_any(str(tmp_path / "old.json"))
    msg = str(e.value)
    assert "\n" not in msg and "sapp.plan/0" in msg and "sapp search --model gpt3-125m --cluster h100-80g:nodes=2" in msg


def _legacy(doc) -> dict:
    """The same plan in the earlier sapp.hetero-plan/1 layout: the mixed fields at the top, the pipeline
    mode's pp plan nested under `plan`, its shape under `pipeline`."""
    from sapp.plan import mixed
    g = doc["groups"]
    old = {"schema": "sapp.hetero-plan/1", "mode": g["mode"], "model": doc["model"], "cluster": doc["cluster"],
           "devices": doc["devices"], "groups": g["members"], "baselines": g["baselines"], "notes": doc["notes"]}
    if g["mode"] == "data":
        return dict(old, predicted=doc["predicted"])
    inner = mixed.inner(doc)
    n = len(doc["notes"]) - 1                       # the mixed document's own note is the last
    inner["notes"] = doc["notes"][:n]
    pr = {k: doc["predicted"][k] for k in ("step_time_s", "bubble_s", "samples_per_s", *mixed.CROSS_KEYS)
          if k in doc["predicted"]}
    return dict(old, notes=doc["notes"][n:], plan=inner, pipeline=mixed.pipe(doc), predicted=pr)


def test_plans_in_the_earlier_mixed_layout_are_migrated_on_read(plans, tmp_path, capsys):
    from sapp.plan import Plan, load_any
    for k in ("data", "pipe"):
        new = json.loads(open(plans[k]).read())
        (tmp_path / f"{k}-old.json").write_text(json.dumps(_legacy(new)))
        kind, plan = load_any(str(tmp_path / f"{k}-old.json"))
        assert kind == "mixed" and plan == Plan(new)       # field for field the plan the search writes now
        rc, out, err = _cli(capsys, "explain", str(tmp_path / f"{k}-old.json"))
        assert rc == 0 and "predicted step" in out, err
    bad = _legacy(json.loads(open(plans["pipe"]).read()))
    bad["pipeline"]["stage_width"] += 1                    # its two copies of the pipeline's shape disagree
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(PlanError) as e:
        load_any(str(tmp_path / "bad.json"))
    assert "\n" not in str(e.value) and "sapp.hetero-plan/1" in str(e.value)


def test_explain_shows_each_groups_plan(plans, capsys):
    rc, out, _ = _cli(capsys, "explain", plans["data"])
    assert rc == 0 and "predicted step" in out
    for g in plans["data_doc"]["groups"]["members"]:
        assert f"group {g['name']}'s plan ({g['batch_share']} of the global batch 64" in out
    assert out.count("Plan for gpt3-125m") == 2 and "Binding constraint" in out
    rc, out, _ = _cli(capsys, "explain", plans["pipe"])
    assert rc == 0 and "the pipeline's plan" in out and "Plan for gpt-small" in out


def test_diff_of_a_mixed_and_a_plain_plan(plans, capsys):
    rc, out, err = _cli(capsys, "diff", plans["data"], plans["plain"])
    assert rc == 0, err
    overall = out.split("\n\n")[0].splitlines()          # the first table: the plans as a whole
    row = {ln.split("  ")[0].strip(): ln for ln in overall}
    assert "mixed (data)" in row["plan"] and "one device kind" in row["plan"]
    for g in plans["data_doc"]["groups"]["members"]:
        assert f"share {g['batch_share']}/64" in row[f"group {g['name']}"]
    assert "dp=16" in row["group h100-80g"]           # the plain plan is one group, named by its cluster
    from sapp.units import fmt_time
    plain = json.loads(open(plans["plain"]).read())
    assert fmt_time(plans["data_doc"]["predicted"]["step_time_s"]) in row["step time"]
    assert fmt_time(plain["predicted"]["step_time_s"]) in row["step time"]
    # then each group's plan against the plain one, field by field
    assert "data.json (a100-80g) vs plain.json" in out and "data.json (h100-80g) vs plain.json" in out
    assert out.count("Operator layouts") == 2
    rc, out, err = _cli(capsys, "diff", plans["pipe"], plans["data"])
    assert rc == 0, err
    assert "mixed (pipeline)" in out and "pipe.json (pipeline) vs data.json (a100-80g)" in out


def test_plot_draws_each_group_and_ends_at_the_predicted_step(plans, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    from sapp.report import plot_mixed
    for kind in ("data", "pipe"):
        out = tmp_path / f"{kind}.png"
        rc, _, err = _cli(capsys, "plot", plans[kind], "--out", str(out))
        assert rc == 0 and out.stat().st_size > 10_000, err
    plt = plot_mixed._pyplot()
    fig = plt.figure()
    try:
        doc = plans["data_doc"]
        end = plot_mixed._groups(fig, doc)
        assert len(fig.axes) == 3           # one chart per group and the sync row
        assert abs(end - doc["predicted"]["step_time_s"]) <= 0.01 * doc["predicted"]["step_time_s"]
    finally:
        plt.close(fig)


def test_export_refuses_with_the_real_reason(plans, capsys):
    rc, out, err = _cli(capsys, "export", plans["data"], "--to", "megatron")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "one device kind" in err and f"sapp run {plans['data']}" in err and "regenerate" not in err


def test_evaluate_reprices_both_modes(plans, capsys, tmp_path):
    rc, out, err = _cli(capsys, "evaluate", plans["data"], "--json")
    assert rc == 0, err
    res = json.loads(out)
    doc = plans["data_doc"]
    assert res["step_time_s"] == pytest.approx(doc["predicted"]["step_time_s"], rel=1e-4)
    assert res["cross_group_sync_s"] == pytest.approx(doc["predicted"]["cross_group_sync_s"], rel=1e-4)
    assert [g["name"] for g in res["groups"]] == ["a100-80g", "h100-80g"]
    for g, mine in zip(res["groups"], doc["groups"]["members"]):
        assert g["step_time_s"] == pytest.approx(mine["step_time_s"], rel=1e-4)
    # a slower link between the groups: only the sync grows
    import dataclasses
    from sapp.cluster.groups import parse
    mc = parse(MIXED)
    dataclasses.replace(mc, link_bw=mc.link_bw / 5).save(tmp_path / "slow.json")
    rc, out, err = _cli(capsys, "evaluate", plans["data"], "--json", "--cluster", str(tmp_path / "slow.json"))
    assert rc == 0, err
    slower = json.loads(out)
    assert slower["cross_group_sync_s"] > 4 * res["cross_group_sync_s"]
    assert [g["step_time_s"] for g in slower["groups"]] == [g["step_time_s"] for g in res["groups"]]
    # a pipeline-mode plan: re-priced on its stages as they are, each on its group
    rc, out, err = _cli(capsys, "evaluate", plans["pipe"], "--json")
    assert rc == 0, err
    res, doc = json.loads(out), plans["pipe_doc"]
    assert res["mode"] == "pipeline" and res["step_time_s"] == pytest.approx(doc["predicted"]["step_time_s"], rel=1e-4)
    owner = [g["name"] for g in doc["groups"]["members"] for _ in g["stages"]]
    assert [s["group"] for s in res["stages"]] == owner
    rc, out, err = _cli(capsys, "evaluate", plans["pipe"], "--json", "--cluster", str(tmp_path / "slow.json"))
    assert rc == 0, err
    slow = json.loads(out)       # only the sends over the link grow
    assert slow["cross_group_send_s"] > 2 * res["cross_group_send_s"] > 0      # (its latency stays) and slow["step_time_s"] > res["step_time_s"]
    assert [s["fwd_s"] for s in slow["stages"]] == [s["fwd_s"] for s in res["stages"]]
    rc, out, err = _cli(capsys, "evaluate", plans["pipe"])
    assert rc == 0 and "stage 0 on" in out and "plan says" in out, err


def test_replan_for_the_nodes_given(plans, capsys, tmp_path):
    from sapp.plan import load_any
    rc, _, err = _cli(capsys, "replan", plans["data"], "--nodes", "2")
    assert rc == 2 and err.count("\n") == 1 and "a100-80g:nodes=1+h100-80g:nodes=1" in err
    out = tmp_path / "one.json"
    rc, text, err = _cli(capsys, "replan", plans["data"], "--cluster", "h100-80g:nodes=2", "--out", str(out))
    assert rc == 0, err
    assert text.startswith("old: mixed plan (data-parallel groups") and "new: dp" in text
    kind, plan = load_any(str(out))
    assert kind == "plan" and plan["devices"] == 16 and plan["model"]["global_batch"] == 64
    out = tmp_path / "more.json"
    rc, text, err = _cli(capsys, "replan", plans["data"], "--cluster", "a100-80g:nodes=1+h100-80g:nodes=2",
                         "--out", str(out))
    assert rc == 0, err
    kind, doc = load_any(str(out))
    assert kind == "mixed" and doc["devices"] == 24 and doc["model"]["global_batch"] == 64
    assert f"on 24 devices: {doc['predicted']['step_time_s']:.4g} s/step" in text
