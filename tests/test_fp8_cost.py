"""FP8 linear layers priced as the engines run them (costmodel/fp8.py): the blocks' linears at the FP8
rate with their casts, the rest bf16; refused where the devices have no FP8 tensor cores; recorded in
the plan, re-scored the same, and refused by the emitter (which runs bf16 linears) in one line."""
import pytest

import sapp
from sapp import api
from sapp.cluster import Cluster
from sapp.costmodel import CostSettings
from sapp.costmodel.fp8 import is_fp8_linear
from sapp.costmodel.nodes import node_cost
from sapp.errors import SappError
from sapp.cluster.mesh import Mesh
from sapp.plan import Plan

H100 = "h100-80g:nodes=1"


@pytest.fixture(scope="module")
def graph():
    return api.capture_spec("llama-tiny")[3]


def test_only_the_blocks_linears_change(graph):
    cl = Cluster.parse(H100)
    mesh = Mesh.for_devices(cl, 1)
    bf16, fp8 = CostSettings(), CostSettings(fp8="tensorwise")
    linears = [n for n in graph.nodes.values() if is_fp8_linear(n)]
    assert linears and all(n.block is not None for n in linears)
    for n in graph.nodes.values():
        a = node_cost(n, (None,) * len(mesh.levels), mesh, cl, bf16)
        b = node_cost(n, (None,) * len(mesh.levels), mesh, cl, fp8)
        if n in linears:
            assert (b.fwd_s, b.bwd_s) != (a.fwd_s, a.bwd_s)
        else:       # attention, norms, the head and the embedding stay bf16
            assert (b.fwd_s, b.bwd_s, b.param_bytes) == (a.fwd_s, a.bwd_s, a.param_bytes), n.name


def test_a_large_model_trains_faster_but_not_twice_as_fast():
    # torchao's tensorwise casts as a compiled block runs them (a "+compile" profile); TE's under "fused"
    args = dict(global_batch=16, constraints={"dp": 8, "tp": 1, "pp": 1, "zero": 3, "recompute": "full"})
    runtime = {"tensorwise": "torchtitan-2412+compile", "delayed": "fused"}
    t = {r: sapp.search("llama3-8b", H100, fp8=r, runtime=rt, **args) for r, rt in runtime.items()}
    for r, p in t.items():
        bf16 = sapp.search("llama3-8b", H100, runtime=runtime[r], **args)
        gain = bf16["predicted"]["step_time_s"] / p["predicted"]["step_time_s"]
        assert 1.05 < gain < 2.0, (r, gain)       # GEMMs at twice the rate, the rest (attention, casts) not
        assert p["settings"]["fp8"] == r
    # the same runtime ("fused") with torchao's casts, eager (one kernel an op)
    eager = sapp.search("llama3-8b", H100, fp8="tensorwise", runtime="fused", **args)
    # Transformer Engine keeps the FP8 weight and its transpose: 2 bytes per local weight element more
    assert t["delayed"]["predicted"]["peak_memory_bytes"] > eager["predicted"]["peak_memory_bytes"]
    # delayed scaling takes the amax inside the cast: fewer passes than torchao's eager tensorwise ops
    assert t["delayed"]["predicted"]["step_time_s"] < eager["predicted"]["step_time_s"]


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise"])
def test_the_plan_records_fp8_and_evaluate_re_scores_it_the_same(tmp_path, recipe):
    p = sapp.search("llama-tiny", H100, global_batch=8, fp8=recipe)
    p.save(tmp_path / "p.json")
    back = Plan.load(tmp_path / "p.json")      # the plan schema takes every priced recipe
    assert back["settings"]["fp8"] == recipe
    res = api.evaluate("llama-tiny", H100, back)
    assert res["step_time_s"] == pytest.approx(p["predicted"]["step_time_s"], rel=1e-5)


def test_fp8_is_refused_without_fp8_tensor_cores_and_outside_bf16(capsys):
    with pytest.raises(SappError, match="has no FP8 tensor cores"):
        sapp.search("llama-tiny", "a100-80g:nodes=1", global_batch=8, fp8="tensorwise")
    with pytest.raises(SappError, match="not priced"):
        CostSettings(fp8="rowwise")
    with pytest.raises(SappError, match="beside bf16 mixed precision"):
        CostSettings(fp8="delayed", precision="fp32")
    from sapp.commands.cli import main
    assert main(["search", "--model", "llama-tiny", "--cluster", H100, "--fp8", "tensorwise",
                 "--target", "megatron"]) == 2
    assert "runs FP8 linears as delayed" in capsys.readouterr().err     # Megatron's TE recipe (engines/fp8.py)


def test_the_emitter_refuses_an_fp8_plan_in_one_line():
    p = sapp.search("gpt-tiny", "cpu:nodes=1,gpus_per_node=1", global_batch=8)
    d = p.to_dict()
    d["settings"]["fp8"] = "tensorwise"          # a plan priced with FP8 linears
    model = sapp.models.get("gpt-tiny", device="cpu")
    with pytest.raises(SappError, match="fp8: plan 'tensorwise'"):
        sapp.emit(model, Plan(d))
    prog = sapp.emit(model, Plan(d), allow_mismatch=True)     # re-priced as run: bf16 linears
    assert any("re-priced as run" in n for n in prog.notes)
