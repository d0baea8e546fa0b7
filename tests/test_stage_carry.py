"""Pipeline stages of a model built like PoolFormer / GraniteMoeHybrid / DeepSeek-V4
(tests/emit_workers/pp_toys.py): the blocks a stage runs are named as the plan names them (capture's
candidates, sapp/capture/blocks.py), and values read further on than the next stage are carried
through the stages between (sapp/emit/pp/stage_carry.py).  In one process: the stages chained by hand
against the whole model (forward and gradients); on 2 gloo ranks: sapp's own pp=2 plan trained 3 steps
against one process."""
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from sapp.capture.blocks import container_children  # noqa: E402
from sapp.emit.checks import manifest  # noqa: E402
from sapp.emit.pp import pipe  # noqa: E402
from tests.emit_workers import pp_toys  # noqa: E402

B = 4


def _chain(model, x, points):
    """The stages of `model` cut before `points`, each called with what the one before returned only
    (as PipelineStage calls them); returns (output, the stage modules)."""
    traced = pipe.trace(model, x, points)
    stages = pipe.stage_modules(traced, list(range(len(points) + 1)))
    out = x
    for i in range(len(stages)):
        out = stages[i](*out)
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return out[0], stages


@pytest.mark.parametrize("n_blocks,points", [(2, ["groups.1.0"]), (3, ["groups.1.0", "groups.2.0"])])
def test_stages_called_with_the_stage_before_only_equal_the_model(n_blocks, points):
    # stage 1 reads `ids` (a model input) and, cut in three, stage 2 reads `e` (made in stage 0, with
    # a gradient): both reach it through the stages between, forward and backward
    model, loss_fn = pp_toys.build(0, n_blocks)
    (x,), y = pp_toys.batch(B, 0)
    out, stages = _chain(model, (x,), points)
    ref = model(x)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    loss_fn(out, y).backward()
    loss_fn(ref, y).backward()
    mine = {n: p.grad for s in stages.values() for n, p in s.named_parameters()}
    for n, p in model.named_parameters():
        torch.testing.assert_close(mine[n], p.grad, rtol=1e-5, atol=1e-7, msg=n)


@pytest.mark.parametrize("direct", [False, True])
def test_a_stage_runs_the_blocks_capture_names(direct):
    # `groups.0` is a ModuleList (never called, never a block); `angles.0` is registered after the
    # blocks and every stage computes the angles, but only stage 0 runs them as capture assigned them.
    # direct: blocks called as `block.forward(...)` are absent from the trace's module stack
    # (SqueezeBERT); capture still names them, as the stages hold them
    from sapp.api import capture_graph
    model, loss_fn = pp_toys.build(0, direct=direct)
    (x,), y = pp_toys.batch(B, 0)
    _, stages = _chain(model, (x,), ["groups.1.0"])
    blocks = sorted(container_children(model))
    got = {s: manifest._stage_blocks(m, blocks) for s, m in stages.items()}
    assert got == {0: ["angles.0", "groups.0.0"], 1: ["groups.1.0"]}
    graph, _ = capture_graph(model, (x,), loss_fn, y)
    assert sorted(graph.blocks) == ["angles.0", "groups.0.0", "groups.1.0"]


# the direct variant (about 30 s) under `pytest -m slow`: the same stage carry, called another way
@pytest.mark.parametrize("kind", ["stagey", pytest.param("stagey-direct", marks=pytest.mark.slow)])
def test_searched_pp2_plan_equals_one_process(tmp_path, kind):
    import sapp
    from sapp.api import search
    model, loss_fn = pp_toys.build(0, direct=kind == "stagey-direct")
    x, y = pp_toys.batch(8, 0)
    plan = search(model, sapp.Cluster.parse("cpu:gpus=2"), global_batch=8, example_inputs=x, loss_fn=loss_fn,
                  targets=y, constraints={"pp": 2, "dp": 1, "tp": 1, "zero": 0})
    listed = [b for s in plan.pipeline["stages"] for b in s["blocks"]]
    assert sorted(listed) == ["angles.0", "groups.0.0", "groups.1.0"]
    path = tmp_path / "pp2.json"
    plan.save(path)
    cases = [{"id": "pp2", "kind": kind, "plan_path": str(path), "steps": 3, "batch": 8}]
    cpath, opath = tmp_path / "cases.json", tmp_path / "out.json"
    cpath.write_text(json.dumps(cases))
    proc = subprocess.run([sys.executable, "-m", "tests.emit_workers.harness", "2", str(cpath), str(opath)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert opath.exists(), proc.stderr[-3000:]
    out = json.loads(opath.read_text())
    assert not out["errors"], "\n".join(out["errors"].values())[-3000:]
    res = out["cases"]["pp2"]
    for r in ("0", "1"):
        got = res["ranks"][r]["losses"]
        assert len(got) == 3
        for a, b in zip(got, res["ref"]):
            assert abs(a - b) <= 1e-5 * abs(b), (r, got, res["ref"])


def test_block_whose_modules_export_records_relative_paths_splits():
    # OpenAI GPT: with the split block's forward patched, torch.export records `attn`, `attn.c_attn`
    # under `transformer.h.1` (relative paths) and torch's outliner refused them; rejoined, the
    # stages chained equal the model
    pytest.importorskip("transformers")
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel
    torch.manual_seed(0)
    cfg = OpenAIGPTConfig(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                          embd_pdrop=0.0, attn_pdrop=0.0)
    model = OpenAIGPTLMHeadModel(cfg).train()
    x = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    out, stages = _chain(model, (x,), ["transformer.h.1"])
    torch.testing.assert_close(out, model(x).logits, rtol=0, atol=1e-5)
    assert "transformer.h.1.attn" in dict(stages[1].named_modules())
