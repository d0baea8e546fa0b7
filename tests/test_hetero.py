"""Mixed clusters (sapp/cluster/groups.py) and the search over their groups (sapp/search/hetero.py)."""
import json
import math

import pytest

from sapp.cluster import Cluster
from sapp.cluster.groups import MixedCluster, parse
from sapp.errors import ClusterError, PlanError


def test_spec_groups_and_default_link_is_the_slower_groups():
    mc = parse("a100-80g:nodes=16+h100-80g:nodes=8")
    assert isinstance(mc, MixedCluster)
    assert [g.name for g in mc.groups] == ["a100-80g", "h100-80g"]
    assert [g.devices for g in mc.groups] == [128, 64] and mc.devices == 192
    assert mc.link_bw == min(g.inter_bw for g in mc.groups) == 25e9
    assert mc.slowest().name == "a100-80g"
    # a one-group spec stays an ordinary Cluster, equal to what Cluster.parse gives
    assert parse("a100-80g:nodes=2") == Cluster.parse("a100-80g:nodes=2")


def test_file_round_trip_and_schema(tmp_path):
    from sapp import schema
    mc = parse("a100-80g:nodes=2+h100-80g:nodes=1,inter_bw=40GB/s")
    mc.save(tmp_path / "mx.json")
    d = json.loads((tmp_path / "mx.json").read_text())
    assert schema.first_error("cluster", d) is None
    assert parse(str(tmp_path / "mx.json")) == mc
    # the homogeneous form still validates, and keeps its own messages
    assert schema.first_error("cluster", Cluster.parse("a100-80g").to_dict()) is None
    assert "missing field" in schema.first_error("cluster", {"nodes": 1})


@pytest.mark.parametrize("spec, words", [
    ("a100-80g:nodes=2+", "empty group"),
    ("a100-80g+nope", "unknown cluster preset"),
    ("a100-80g:nodes=0+h100-80g", "positive"),
])
def test_bad_specs_are_one_line(spec, words):
    with pytest.raises(ClusterError) as e:
        parse(spec)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["link"].__setitem__("bw", -1), "link.bw"),
    (lambda d: d["groups"].pop(), "at least 2"),
    (lambda d: d["groups"][1].__setitem__("name", d["groups"][0]["name"]), "two groups are named"),
    (lambda d: d["groups"][0].pop("peak_flops"), "missing field"),
    (lambda d: d.__setitem__("extra", 1), "unknown field"),
])
def test_bad_files_are_one_line(tmp_path, edit, words):
    d = parse("a100-80g:nodes=2+h100-80g:nodes=1").to_dict()
    edit(d)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ClusterError) as e:
        parse(str(p))
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def small():
    from sapp.api import capture_spec, tp_search_fn
    from sapp.costmodel import CostSettings
    graph = capture_spec("gpt3-125m")[3]
    return graph, CostSettings(), tp_search_fn()


def test_free_search_equals_exhaustive_and_shares_follow_speed(small):
    from sapp.search import hetero
    graph, settings, fn = small
    mc = parse("a100-80g:nodes=1+h100-80g:nodes=1")
    free = hetero.search(graph, mc, global_batch=16, settings=settings, search_fn=fn, q=2)
    full = hetero.search(graph, mc, global_batch=16, settings=settings, search_fn=fn, q=2, exhaustive=True,
                         baselines=False)
    assert free[1] == full[1] and free[0] == full[0]
    assert free[2]["evaluations"] < full[2]["evaluations"]     # (bounded group searches included)
    a100, h100 = free[0]
    assert sum(free[0]) == 16 and 0 < a100 < h100          # the faster group takes the larger share
    d = free[2]
    # the step: the slower group on its share plus the cross-group sync
    pr = d["pricer"]
    assert free[1] == pytest.approx(max(pr.time(0, a100), pr.time(1, h100)) + d["sync_s"])
    # it beats each group alone and all devices priced as A100s
    assert free[1] < min(d["alone"].values()) and free[1] < d["uniform"]
    # (that baseline started from the A100 group's tp layouts: the step of a fresh search)
    from sapp.search.constraints import Constraints
    assert d["uniform"] == hetero.uniform_baseline(graph, mc, 16, Constraints.from_dict(None), settings, fn)


def test_free_search_equals_exhaustive_v100_and_h100(small):
    from sapp.search import hetero
    graph, settings, fn = small
    mc = parse("v100-32g:nodes=1,gpus=4+h100-80g:nodes=1,gpus=4")
    free = hetero.search(graph, mc, global_batch=12, settings=settings, search_fn=fn, q=2, baselines=False)
    full = hetero.search(graph, mc, global_batch=12, settings=settings, search_fn=fn, q=2, exhaustive=True,
                         baselines=False)
    assert free[:2] == full[:2]


def test_cutoff_keeps_the_plan_at_or_below_it_and_says_none_above(small):
    from sapp.search.joint import joint_search
    graph, settings, fn = small
    cl = Cluster.parse("a100-80g:nodes=1")
    full = joint_search(graph, cl, global_batch=32, settings=settings, search_fn=fn)
    for cutoff in (full.step_time_s, full.step_time_s * 1.5):
        cut = joint_search(graph, cl, global_batch=32, settings=settings, search_fn=fn, cutoff=cutoff)
        assert cut.config == full.config and cut.step_time_s == full.step_time_s
    # above it: None, or the plan itself where the search proved it optimal before its bounds passed the cutoff
    above = joint_search(graph, cl, global_batch=32, settings=settings, search_fn=fn, cutoff=full.step_time_s * 0.999)
    assert above is None or (above.config == full.config and above.step_time_s == full.step_time_s)
    far = joint_search(graph, cl, global_batch=32, settings=settings, search_fn=fn, cutoff=full.step_time_s * 0.5)
    assert far is None


def test_pricer_bounded_answer_is_above_and_the_exact_one_is_searched_again(small):
    from sapp.search.constraints import Constraints
    from sapp.search.hetero import GroupPricer
    graph, settings, fn = small
    mc = parse("a100-80g:nodes=1+h100-80g:nodes=1")
    fresh = GroupPricer(graph, mc, Constraints.from_dict(None), settings, fn)
    exact = fresh.time(0, 24)
    pr = GroupPricer(graph, mc, Constraints.from_dict(None), settings, fn)
    assert pr.time(0, 24, exact * 0.5) == math.inf          # above the cutoff: no exact answer kept
    assert (0, 24) not in pr.cache and pr.above[(0, 24)] == exact * 0.5
    assert pr.time(0, 24, exact * 0.4) == math.inf and pr.searches == 1     # known above: not searched
    assert pr.time(0, 24) == exact and pr.searches == 2
    assert pr.time(0, 16, exact * 2) == fresh.time(0, 16)    # below the cutoff: the exact step


def test_sync_grows_as_the_link_slows(small):
    from sapp.search import hetero
    graph, settings, _ = small
    fast = MixedCluster.build(parse("a100-80g+h100-80g").groups, link_bw=100e9)
    slow = MixedCluster.build(parse("a100-80g+h100-80g").groups, link_bw=1e9)
    assert hetero.sync_s(graph, slow, settings, [0, 1]) > 50 * hetero.sync_s(graph, fast, settings, [0, 1]) > 0
    assert hetero.sync_s(graph, slow, settings, [1]) == 0.0


def test_hetero_plan_document_cli(tmp_path, capsys):
    from sapp.commands.cli import main
    out = tmp_path / "h.json"
    assert main(["search", "--model", "gpt3-125m", "--cluster", "a100-80g:nodes=1+h100-80g:nodes=1",
                 "--batch", "64", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    from sapp.api import mixed as hetero_plan
    from sapp import schema
    assert doc["schema"] == "sapp.plan/1" and schema.first_error("plan", doc) is None   # one plan schema
    shares = [g["batch_share"] for g in doc["groups"]["members"]]
    assert sum(shares) == 64
    for g in doc["groups"]["members"]:
        if g["batch_share"]:
            assert g["plan"]["model"]["global_batch"] == g["batch_share"]
            assert g["plan"]["devices"] == g["devices"]
    assert set(doc["groups"]["baselines"]["alone"]) == {"a100-80g", "h100-80g"}
    capsys.readouterr()
    assert main(["explain", str(out)]) == 0
    text = capsys.readouterr().out
    assert "group a100-80g" in text and "baseline all devices as the slowest kind" in text
    doc["groups"]["members"][0]["batch_share"] += 1
    with pytest.raises(PlanError):
        hetero_plan.check(doc)


def test_clusters_shows_groups(capsys):
    from sapp.commands.cli import main
    assert main(["clusters", "a100-80g:nodes=16+h100-80g:nodes=8"]) == 0
    text = capsys.readouterr().out
    assert "group a100-80g: 16 x 8" in text and "group h100-80g: 8 x 8" in text and "link between groups" in text


def test_homogeneous_entry_points_refuse_a_mixed_cluster_in_one_line():
    import sapp
    with pytest.raises(ClusterError) as e:
        sapp.search("gpt3-125m", "a100-80g+h100-80g")
    assert "sapp search --cluster A+B" in str(e.value) and "\n" not in str(e.value)


def test_the_plan_schema_states_a_mixed_clusters_groups(capsys):
    """One plan schema for both kinds: `sapp schema plan` holds the groups section; there is no other."""
    from sapp.commands.cli import main
    assert main(["schema", "plan"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["properties"]["schema"]["const"] == "sapp.plan/1" and s["properties"]["groups"] == {"$ref": "#/$defs/groups"}
    assert set(s["$defs"]["groups"]["properties"]["mode"]["enum"]) == {"data", "pipeline"}
    with pytest.raises(SystemExit):
        main(["schema", "hetero"])
