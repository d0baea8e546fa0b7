"""`sapp replan` and the re-plan an elastic job makes: the same model, global batch and pins that
still fit, searched for the devices left; one line when nothing fits; and a job whose rank 0 dies
inside the re-plan's search restarts, re-plans and trains as a fault-free run of that plan."""
import json
import os
import subprocess
import sys

import pytest

from sapp.errors import SappError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
DATA = "tests.emit_workers.datasets:tokens"


def _sapp(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "sapp.commands.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(ENV, **(env or {})))


@pytest.fixture(scope="module")
def plan4(tmp_path_factory):
    from sapp.api import search
    path = tmp_path_factory.mktemp("replan") / "plan.json"
    search("gpt-tiny", "cpu:gpus=2,nodes=2", global_batch=8, constraints={"pp": 2, "dp": 2}).save(path)
    return path


def test_replan_keeps_batch_and_the_pins_that_fit(plan4):
    from sapp.plan import Plan
    from sapp.api.replan import replan, scaled_cluster
    plan = Plan.load(plan4)
    r = replan("gpt-tiny", plan, scaled_cluster(plan, nodes=1))
    assert r.plan["devices"] == 2 and r.plan["model"]["global_batch"] == 8
    assert r.plan["parallel"]["pp"] == 2 and r.dropped_pins == ["dp=2"]      # pp=2 still fits 2 devices
    assert r.plan["constraints"] == {"pp": 2}
    lines = r.lines()
    assert lines[0].startswith("old: dp 2 tp 1 pp 2") and "on 4 devices" in lines[0]
    assert lines[1].startswith("new: dp 1 tp 1 pp 2") and "on 2 devices" in lines[1]
    assert "pins dropped (no plan fits with them): dp=2" in lines


def test_sapp_replan_command(plan4, tmp_path):
    p = _sapp("replan", str(plan4), "--nodes", "1", "--out", str(tmp_path / "new.json"))
    assert p.returncode == 0, p.stderr
    assert "new: dp 1 tp 1 pp 2" in p.stdout and json.loads((tmp_path / "new.json").read_text())["devices"] == 2
    for bad, says in ((["--nodes", "0"], "at least 1"), (["--devices", "3"], "not a multiple of the plan's 2")):
        p = _sapp("replan", str(plan4), *bad)
        assert p.returncode == 2 and says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_nothing_fits_is_one_line():
    import sapp
    from sapp.api.replan import replan, scaled_cluster
    plan = sapp.search("gpt3-175b", "a100-80g:nodes=128", global_batch=1536)
    with pytest.raises(SappError) as e:
        replan("gpt3-175b", plan, scaled_cluster(plan, devices=8))
    assert "no plan fits 8 devices" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_rank0_killed_inside_the_replan_restarts_and_trains_as_that_plan(plan4, tmp_path):
    """An elastic job started on 2 processes with a plan for 4: rank 0 SIGKILLs itself inside the
    re-plan's search; torchrun restarts the group, which re-plans and runs 6 steps, with the losses of
    the re-planned plan run on its own."""
    p = _sapp("run", str(plan4), "--model", "gpt-tiny", "--model-arg", "dropout=0", "--steps", "6", "--data", DATA,
              "--nproc", "2", "--elastic", "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "3",
              "--max-restarts", "1", "--out", str(tmp_path / "out.json"), env={"SAPP_FAULT_REPLAN": "1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "re-planned for 2 devices (the plan is for 4)" in p.stdout
    plans = os.listdir(tmp_path / "ck" / "plans")
    assert plans == ["step-00000000-devices-2.json"], plans
    got = json.loads((tmp_path / "out.json").read_text())["losses"]
    p = _sapp("run", str(tmp_path / "ck" / "plans" / plans[0]), "--model", "gpt-tiny", "--model-arg", "dropout=0",
              "--steps", "6", "--data", DATA, "--out", str(tmp_path / "ref.json"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert got == json.loads((tmp_path / "ref.json").read_text())["losses"]


def test_replan_keeps_the_optimizer_and_gradient_width():
    # a plan priced with SGD and fp32 main_grads (as a Megatron import sets them) re-plans priced the same way
    from sapp.api import resolve_cluster, search
    from sapp.api.replan import replan, scaled_cluster
    plan = search("gpt-tiny", "cpu:gpus=2,nodes=2", global_batch=8, optimizer="sgd", grad_fp32=True,
                  precision="bf16-mixed")
    r = replan("gpt-tiny", plan, scaled_cluster(plan, nodes=1))
    assert r.plan["settings"]["optimizer"] == "sgd" and r.plan["settings"].get("grad_fp32") is True
    same = search("gpt-tiny", resolve_cluster("cpu:gpus=2,nodes=1"), global_batch=8, optimizer="sgd", grad_fp32=True,
                  precision="bf16-mixed", constraints=r.plan["constraints"] or None)
    assert r.plan["predicted"]["peak_memory_bytes"] == same["predicted"]["peak_memory_bytes"]


def test_a_node_count_with_no_uniform_layout_prices_the_idle_nodes_as_a_second_group():
    # 3 nodes of 2 devices, batch 8: no dp x tp x pp of 6 devices divides it, so the plan uses 2 nodes;
    # the note prices the third as its own data-parallel group (search/hetero.py), and the plan is the
    # one searching every candidate in full picks (replan_price's lazy pricing changes no byte but the note)
    from sapp.api import capture_spec, search, tp_search_fn
    from sapp.cluster.groups import parse
    from sapp.costmodel import CostSettings
    from sapp.api.replan import replan, scaled_cluster
    from sapp.search import hetero
    from sapp.search.joint import joint_search
    plan = search("gpt-tiny", "cpu:gpus=2,nodes=4", global_batch=8)
    r = replan("gpt-tiny", plan, scaled_cluster(plan, nodes=3))
    full = replan("gpt-tiny", plan, scaled_cluster(plan, nodes=3), search=search)
    assert r.nodes == full.nodes == 2 and r.tried[0] == (3, full.tried[0][1])
    note = r.plan["notes"][-1]
    assert note == r.idle_note and note.startswith("1 of 3 nodes idle: using them as a second data-parallel group")
    got = r.plan.to_dict()
    got["notes"] = got["notes"][:-1]
    assert got == full.plan.to_dict()
    # the price the note states: the 2 nodes at the plan's layout (dp 4: shares in fours), the idle node
    # searched free, each group's step priced alone, plus the cross-group all-reduce
    spec = note.split("--cluster ")[1].split()[0]
    assert spec == "cpu:gpus=2,nodes=2+cpu:gpus=2,nodes=1"
    mc = parse(spec)
    graph = capture_spec("gpt-tiny")[3]
    settings = CostSettings(precision=mc.groups[0].precision, dropout_noise=not mc.groups[0].fused_dropout)
    assert "the 2 at this plan's layout, batch shares 4 + 4," in note
    par = r.plan["parallel"]
    pinned = {"dp": par["dp"], "tp": par["tp"], "pp": par["pp"]}
    t = max(joint_search(graph, mc.groups[0], global_batch=4, constraints=pinned, settings=settings,
                         search_fn=tp_search_fn()).step_time_s,
            joint_search(graph, mc.groups[1], global_batch=4, settings=settings, search_fn=tp_search_fn()).step_time_s)
    priced = t + hetero.sync_s(graph, mc, settings, [0, 1])
    assert f"prices {priced:.4g} s/step" in note
    assert priced < r.new["step_time_s"] and "faster than this plan's" in note
    # the mixed search the note names prices every group's layout: at most the note's price
    _, step, _ = hetero.search(graph, mc, global_batch=8, baselines=False, settings=settings, search_fn=tp_search_fn())
    assert step <= priced
    assert note in "\n".join(r.lines())


def test_a_captured_graph_with_a_target_replans_as_searching_every_count_does():
    # a captured OpGraph is its own graph (the lazy pricing once got None for it), and a runtime the
    # pinned target does not run is refused in the pricing as api.search refuses it: the target pin is
    # dropped, as the full search of every count drops it
    from sapp.api import capture_spec, search
    from sapp.plan import Plan
    from sapp.api.replan import replan, scaled_cluster
    graph = capture_spec("gpt-tiny")[3]
    d = search(graph, "cpu:gpus=2,nodes=4", global_batch=8, constraints={"target": "megatron", "zero": 1}).to_dict()
    d["settings"]["runtime"] = "torchtitan"
    plan = Plan(d)
    r = replan(graph, plan, scaled_cluster(plan, nodes=3))
    full = replan(graph, plan, scaled_cluster(plan, nodes=3), search=search)
    assert r.dropped_pins == full.dropped_pins == ["target=megatron"] and r.nodes == full.nodes
    got = r.plan.to_dict()
    if r.idle_note:
        got["notes"] = got["notes"][:-1]
    assert got == full.plan.to_dict()
