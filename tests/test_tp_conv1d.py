"""Tensor parallelism for Hugging Face's Conv1D (GPT-2's linears: weight stored [in, out], computed as
`addmm(bias, x.view(-1, in), weight)`).  The layout must see it as a linear (sapp/search/tp_layout.py)
and the emitter must split it on its own layout (sapp/emit/tp/conv1d.py): column split = weight dim 1 and
the bias, row split = weight dim 0 with the bias added once.  GPT-2's fused q|k|v (c_attn) is cut by
`split` into q, k, v, which a contiguous column split would mix up (rank 0: all of q, half of k): it
is split by heads instead (sapp/emit/tp/fused.py: its output columns put in rank order first), one
region with the attention's c_proj."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

KIND = "cat:gpt2"           # tests/emit_workers/hf_catalogue_models.py: 2 layers, width 64, 4 heads, FFN 256


def _graph():
    from sapp.api import capture_graph
    from tests.emit_workers import hf_catalogue_models as C
    model, loss_fn = C.build(KIND)
    x, y = C.batch(KIND, 2, 0)
    return model, x, capture_graph(model, x, loss_fn, y)[0]


def test_layout_and_shape_audit_split_conv1d():
    from sapp.emit.tp import conv1d, parallel
    from sapp.emit.checks import shape_audit
    from sapp.search import tp_layout
    model, x, graph = _graph()
    by_opener = {graph.nodes[r.openers[0]].module: r for r in tp_layout.regions(graph, 2)}
    # the MLP (c_fc -> gelu -> c_proj) is a valid region; so is the fused q|k|v, split by heads
    mlp = by_opener["transformer.h.0.mlp.c_fc"]
    assert mlp.why == "" and [graph.nodes[c].module for c in mlp.closers] == ["transformer.h.0.mlp.c_proj"]
    attn = by_opener["transformer.h.0.attn.c_attn"]
    assert attn.why == "" and [graph.nodes[c].module for c in attn.closers] == ["transformer.h.0.attn.c_proj"]
    assert list(attn.parts.values()) == [[64, 64, 64]]
    styles, groups = {}, []
    for i in range(2):
        fc, proj = f"transformer.h.{i}.mlp.c_fc", f"transformer.h.{i}.mlp.c_proj"
        styles.update({fc: "colwise", proj: "rowwise"})
        groups.append([fc, proj])
    local = parallel.local_layers(model, styles, 2, groups)
    mods = dict(model.named_modules())
    assert conv1d.is_conv1d(mods["transformer.h.0.mlp.c_fc"])
    # this rank's shapes on Conv1D's [in, out] layout: c_fc keeps 64 in, 128 of 256 out; c_proj 128 in
    assert tuple(local["transformer.h.0.mlp.c_fc"].weight.shape) == (64, 128)
    assert tuple(local["transformer.h.0.mlp.c_fc"].bias.shape) == (128,)
    assert tuple(local["transformer.h.0.mlp.c_proj"].weight.shape) == (128, 64)
    assert tuple(local["transformer.h.0.mlp.c_proj"].bias.shape) == (64,)
    notes = []
    assert shape_audit.check(model, styles, groups, 2, x, notes) > 0


def test_gpt2_tp2_shards_conv1d_and_equals_one_process(tmp_path):
    from tests.emit_workers import hf_harness
    cases, plans = hf_harness.job(2, [(KIND, "tp2")], tmp_path)
    case, plan = cases[f"{KIND}-tp2"], plans[f"{KIND}-tp2"]
    styles = plan["tp_modules"]
    for i in range(2):
        assert styles[f"transformer.h.{i}.mlp.c_fc"] == "colwise"
        assert styles[f"transformer.h.{i}.mlp.c_proj"] == "rowwise"
        # the fused q|k|v is split by heads (never as if q, k and v were one tensor), closed by c_proj
        assert styles[f"transformer.h.{i}.attn.c_attn"] == "colwise"
        assert styles[f"transformer.h.{i}.attn.c_proj"] == "rowwise"
        assert plan["tp_layout"]["parts"][f"transformer.h.{i}.attn.c_attn"] == [64, 64, 64]
    ref = case["ref"]
    for r in ("0", "1"):
        got = case["ranks"][r]
        assert "error" not in got, got
        # what each rank runs, read off its parameters' DTensor placements (emit/manifest.py)
        assert got["tp_modules"] == styles
        # GPT-2's head is tied to wte: both split by vocabulary, one weight (Megatron's layout)
        assert styles["lm_head"] == "colwise_gather" and styles["transformer.wte"] == "vocab"
        conv = [n for n in styles if n not in ("lm_head", "transformer.wte")]
        assert got["dtensor_params"] == 2 * len(conv) + 1        # each Conv1D's weight and bias, the table once
        assert len(got["losses"]) == len(ref) == 3
        for a, b in zip(got["losses"], ref):
            assert abs(a - b) <= 1e-5 * abs(b), (got["losses"], ref)


class Conv1DBlock(nn.Module):
    """GPT-2's shapes in small: a fused q|k|v-like Conv1D whose output is split in three (a lone column
    split, gathered), then an MLP of Conv1Ds (column -> row split), with biases everywhere."""

    def __init__(self, d=8, f=16):
        from transformers.pytorch_utils import Conv1D
        super().__init__()
        self.c_attn = Conv1D(3 * d, d)
        self.c_fc, self.c_proj = Conv1D(f, d), Conv1D(d, f)

    def forward(self, x):
        q, k, v = self.c_attn(x).split(x.shape[-1], dim=-1)
        h = x + q * torch.sigmoid(k) + v
        return self.c_proj(torch.tanh(self.c_fc(h)))


STYLES = {"c_attn": "colwise_gather", "c_fc": "colwise", "c_proj": "rowwise"}
GROUPS = [["c_attn"], ["c_fc", "c_proj"]]


def _reference():
    torch.manual_seed(0)
    m = Conv1DBlock()
    with torch.no_grad():           # non-zero biases, so a bias added twice or split wrongly shows
        for p in m.parameters():
            p.normal_()
    x = torch.randn(3, 5, 8)
    loss = m(x).pow(2).sum()
    loss.backward()
    return m, x, float(loss.detach())


def _run(rank, world, store) -> dict:
    """Both apply_tp paths on copies of the reference block, on this gloo rank."""
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from sapp.emit.tp import parallel
    ref, x, ref_loss = _reference()
    res = {"ref": ref_loss}
    mesh = init_device_mesh("cpu", (world,))
    for how, groups in (("derived", GROUPS), ("hand-written", None)):
        m = copy.deepcopy(ref)
        m.zero_grad()
        sharded = parallel.apply_tp(m, STYLES, mesh, notes=[], groups=groups)
        loss = m(x).pow(2).sum()
        loss.backward()
        diff, local = 0.0, {}
        for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            diff = max(diff, float((g - q.grad).abs().max() / q.grad.abs().max()))   # relative
            local[n] = list((p.to_local() if hasattr(p, "to_local") else p).shape)
        res[how] = {"loss": float(loss.detach()), "grad_diff": diff, "sharded": sharded, "local": local}
    dist.destroy_process_group()
    return res


def _rank(rank, world, _cases, out_dir, store):
    """A rank of tests/emit_workers/harness.fork_ranks: `_run`'s result (or its error) in rank<r>.json."""
    try:
        res, code = _run(rank, world, store), 0
    except BaseException as e:                 # noqa: BLE001 - reported to the test
        res, code = {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}, 1
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    os._exit(code)


def test_conv1d_styles_equal_one_process_loss_and_gradients():
    """Both apply_tp paths (a searched layout's groups, a hand-written tp_modules): each Conv1D holds
    this rank's half on its own [in, out] layout, and loss and every gradient equal one process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        # a fresh process forks the ranks (not pytest's); a hung collective fails the test
        subprocess.run([sys.executable, "-m", "tests.test_tp_conv1d", out], cwd=ROOT, timeout=120, check=False,
                       env=dict(os.environ, PYTHONPATH=ROOT))
        with open(out) as f:
            per_rank = json.load(f)
    assert len(per_rank) == 2, per_rank
    for g in per_rank.values():
        assert "error" not in g, g["error"]
        for how in ("derived", "hand-written"):
            r = g[how]
            assert r["sharded"] == ["c_attn", "c_fc", "c_proj"]
            assert r["local"] == {"c_attn.weight": [8, 12], "c_attn.bias": [12], "c_fc.weight": [8, 8],
                                  "c_fc.bias": [8], "c_proj.weight": [8, 8], "c_proj.bias": [8]}
            assert abs(r["loss"] - g["ref"]) <= 1e-5 * abs(g["ref"])
            assert r["grad_diff"] <= 1e-5


if __name__ == "__main__":
    from tests.emit_workers.harness import fork_ranks
    with open(sys.argv[1], "w") as f:
        json.dump(fork_ranks(_rank, 2, [])[1], f)
