"""Fused q/k/v attention split by heads (sapp/search/tp_layout.py `fused_parts`, sapp/emit/tp/fused.py):
a decoder block with `qkv = Linear(d, 3d)` + `chunk(3)`, a ViT block with `to_qkv` + `chunk(3)` and a
grouped-query block with `wqkv` + `split([q, kv, kv])` (tests/emit_workers/fused_qkv.py).

At tp=2 the search shards the fused projection column-wise and the output projection row-wise (one
region, as Megatron does), the plan names the pieces, and sequence parallelism places its pieces on
those blocks.  Each plan trains on 2 gloo ranks in float64 equal to one process (losses of 3 Adam
steps, 1e-10), every rank's fused weight (its rows put back in the model's order) equals one
process's, and a checkpoint written at tp=2 holds the model's own rows: read alone with DCP it
equals one process's weights, and it resumes at tp=2 to the loss one process has at the next step."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.emit_workers import fused_qkv as F, harness  # noqa: E402

STEPS = 3
TP_CLUSTER = "cpu:gpus=2,peak_flops=1e8,intra_latency=0,intra_bw=1e15,op_overhead=0,sharded_op_overhead=0"
CASES = {"decoder-tp2": ("decoder", False), "vit-tp2": ("vit", False), "gqa-tp2": ("gqa", False),
         "decoder-tp2+sp": ("decoder", True), "vit-tp2+sp": ("vit", True), "gqa-tp2+sp": ("gqa", True)}
# trained on 2 ranks in the suite: every block's fused split under SP (the same split as without it), and
# GQA's without it (its checkpoint); the decoder's and ViT's plain tp2 train under `pytest -m slow`
TRAINED = ("gqa-tp2", "decoder-tp2+sp", "vit-tp2+sp", "gqa-tp2+sp")


def _search(kind, sp):
    from sapp.api import search
    x, y = F.data(0)
    return search(F.build(kind).to("meta"), TP_CLUSTER, global_batch=F.BATCH, example_inputs=(x,),
                  constraints={"dp": 1, "tp": 2, "pp": 1, "sp": sp}, loss_fn=F.loss_fn, targets=y)


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fused_plans")
    out = {}
    for case, (kind, sp) in CASES.items():
        plan = _search(kind, sp)
        path = str(tmp / f"{case}.json")
        plan.save(path)
        out[case] = (path, plan)
    return out


def test_fused_projection_and_output_projection_are_one_region(plans):
    for case, (path, plan) in plans.items():
        kind, sp = CASES[case]
        fused, proj = F.FUSED[kind], F.OUT[kind]
        for i in range(2):
            assert plan["tp_modules"].get(f"layers.{i}.attn.{fused}") == "colwise", (case, plan["tp_modules"])
            assert plan["tp_modules"].get(f"layers.{i}.attn.{proj}") == "rowwise", (case, plan["tp_modules"])
            assert [f"layers.{i}.attn.{fused}", f"layers.{i}.attn.{proj}"] in plan["tp_layout"]["groups"]
        want = [F.DIM] * 3 if kind != "gqa" else [F.DIM, F.DIM // 2, F.DIM // 2]
        assert plan["tp_layout"]["parts"] == {f"layers.{i}.attn.{fused}": want for i in range(2)}, case
        assert bool(plan.parallel.get("sp")) is sp and (("sp" in plan["tp_layout"]) is sp), (case, plan.notes)


def test_rank_order_and_segments_agree():
    from sapp.emit.tp.fused import order, segments
    for sizes, tp in (([8, 8, 8], 2), ([8, 4, 4], 4), ([6, 2, 2], 2)):
        idx = order(sizes, tp)
        assert sorted(idx) == list(range(sum(sizes)))
        for start, model_start, rows in segments(sizes, tp):
            assert idx[start:start + rows] == list(range(model_start, model_start + rows))
        block = sum(sizes) // tp            # rank r's block: its share of every piece, in order
        offs = [sum(sizes[:j]) for j in range(len(sizes))]
        for r in range(tp):
            want = [o + r * (n // tp) + i for o, n in zip(offs, sizes) for i in range(n // tp)]
            assert idx[r * block:(r + 1) * block] == want


def test_a_plan_naming_other_pieces_is_refused(plans):
    from sapp.emit import emit
    from sapp.errors import PlanError
    from sapp.plan import Plan
    path, _ = plans["decoder-tp2"]
    d = json.load(open(path))
    d["tp_layout"]["parts"]["layers.0.attn.qkv"] = [36, 36]
    bad = Plan(d)
    x, _ = F.data(0)
    with pytest.raises(PlanError) as e:
        emit(F.build("decoder"), bad, loss_fn=F.loss_fn, example_inputs=(x,), rank=0, world=2, check_fingerprint=False)
    assert "tp_layout.parts['layers.0.attn.qkv']" in str(e.value) and "\n" not in str(e.value)


def test_a_hand_written_column_split_of_a_fused_projection_is_refused(plans):
    """Without the search's layout (no tp_layout groups) tp_modules splits layers as they are: a
    'colwise' fused q/k/v would give rank 0 all of q and half of k.  Refused before the first step."""
    from sapp.emit import emit
    from sapp.errors import PlanError
    from sapp.plan import Plan
    path, _ = plans["decoder-tp2"]
    d = json.load(open(path))
    d.pop("tp_layout")
    x, _ = F.data(0)
    with pytest.raises(PlanError) as e:
        emit(F.build("decoder"), Plan(d), loss_fn=F.loss_fn, example_inputs=(x,), rank=0, world=2,
             check_fingerprint=False)
    msg = str(e.value)
    assert "tp_modules['layers.0.attn.qkv']" in msg and "[24, 24, 24]" in msg and "\n" not in msg, msg


def _rank(rank, world, cases, out_dir, store):
    from tests.emit_workers.hf_models import default_dtype

    def run():
        with default_dtype("float64"):
            return {name: _train(kind, path, ckpt, world) for name, kind, path, ckpt in cases}
    harness.gloo_rank(rank, world, store, out_dir, run)


def _train(kind, path, ckpt, world):
    from sapp.emit import emit
    from sapp.emit.runtime.checkpoint import Checkpointer
    from sapp.emit.runtime.train_state import model_names
    from sapp.emit.tp.fused import order
    from sapp.plan import Plan
    x0, _ = F.data(0)
    model = F.build(kind)
    names = model_names(model)
    prog = emit(model, Plan.load(path), loss_fn=F.loss_fn, lr=1e-3, example_inputs=(x0,), check_fingerprint=False)
    losses = []
    for i in range(STEPS):
        x, y = F.data(i)
        losses.append(prog.step(*prog.shard((x,), y)))
    out = {"losses": losses, "notes": prog.notes}
    w = dict(model.named_modules())[f"layers.0.attn.{F.FUSED[kind]}"].weight
    if hasattr(w, "full_tensor"):               # the model itself runs (no pipeline stage holds it)
        w = w.full_tensor()
        back = torch.empty_like(w)
        back[torch.tensor(order(F.SIZES[kind], 2))] = w     # rank order -> the model's order
        out["fused_weight"] = back.flatten().tolist()
    if ckpt:
        ck = Checkpointer(ckpt, keep=1, names=names, world=world)
        path_ck = ck.save(prog, STEPS, {"global_batch": F.BATCH})
        out["checkpoint"] = path_ck
        again = F.build(kind, seed=1)            # other initial weights: all of them must come from the file
        prog2 = emit(again, Plan.load(path), loss_fn=F.loss_fn, lr=1e-3, example_inputs=(x0,),
                     check_fingerprint=False)
        Checkpointer(ckpt, names=model_names(F.build(kind)), world=world).load(prog2, path_ck)
        x, y = F.data(STEPS)
        out["resumed_loss"] = prog2.step(*prog2.shard((x,), y))
    return out


@pytest.fixture(scope="module")
def per_rank(plans, tmp_path_factory):
    ck = str(tmp_path_factory.mktemp("fused_ckpt"))
    cases = [(c, CASES[c][0], path, ck if c == "gqa-tp2" else None) for c, (path, _) in plans.items()
             if c in TRAINED]
    return harness.spawn_cases("tests.test_fused_qkv", cases, timeout=400)


@pytest.fixture(scope="module")
def per_rank_plain(plans):
    cases = [(c, CASES[c][0], path, None) for c, (path, _) in plans.items() if c not in TRAINED]
    return harness.spawn_cases("tests.test_fused_qkv", cases, timeout=400)


def _reference(kind, steps):
    """One process's losses and model after `steps` Adam steps, float64."""
    from tests.emit_workers.hf_models import default_dtype
    with default_dtype("float64"):
        m = F.build(kind)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        losses = []
        for i in range(steps):
            x, y = F.data(i)
            loss = F.loss_fn(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    return losses, m


def _close(a, b, tol=1e-10):
    return all(abs(p - q) <= tol * max(1.0, abs(q)) for p, q in zip(a, b)) and len(a) == len(b)


def _trains_equal(cases, per_rank):
    for case in cases:
        kind, _ = CASES[case]
        ref, m = _reference(kind, STEPS)
        want = dict(m.named_modules())[f"layers.0.attn.{F.FUSED[kind]}"].weight.detach().flatten().tolist()
        for r, got in per_rank.items():
            assert _close(got[case]["losses"], ref), (case, r, got[case]["losses"], ref)
            assert _close(got[case]["fused_weight"], want), (case, r)


def test_fused_tp_trains_equal_to_one_process(per_rank):
    _trains_equal(TRAINED, per_rank)


@pytest.mark.slow
def test_plain_fused_tp_of_decoder_and_vit_trains_equal_to_one_process(plans, per_rank_plain):
    _trains_equal([c for c in plans if c not in TRAINED], per_rank_plain)


def test_checkpoint_holds_the_model_rows_and_resumes(per_rank):
    import torch.distributed.checkpoint as dcp
    from tests.emit_workers.hf_models import default_dtype
    ref, m = _reference("gqa", STEPS + 1)
    _, at = _reference("gqa", STEPS)
    path = per_rank["0"]["gqa-tp2"]["checkpoint"]
    state = {f"model.{k}": torch.zeros_like(v, dtype=torch.float64) for k, v in at.state_dict().items()}
    with default_dtype("float64"):
        dcp.load(state, checkpoint_id=path, no_dist=True)
    for k, v in at.state_dict().items():
        assert torch.allclose(state[f"model.{k}"], v.double(), rtol=0, atol=1e-12), k
    for r, got in per_rank.items():
        assert abs(got["gqa-tp2"]["resumed_loss"] - ref[STEPS]) <= 1e-10 * abs(ref[STEPS]), (r, got["gqa-tp2"], ref)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        todo = json.load(f)
    with open(sys.argv[2], "w") as f:
        json.dump(harness.fork_ranks(_rank, 2, todo)[1], f)
