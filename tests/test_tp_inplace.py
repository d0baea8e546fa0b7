"""A tensor-parallel layer's output the model then modifies in place (HF Falcon's parallel block:
`mlp_output += attention_output`): DTensor's to_local() hands out a view made inside a custom autograd
Function, which autograd forbids modifying in place, so the step stopped at step 0.  sapp hands out a
non-view local tensor with the same backward (sapp/emit/tp/dtensor_local.py): 2 gloo ranks train our
Falcon-like block with a derived tp layout and must equal one process (loss and gradients)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ParallelBlock(nn.Module):
    """Falcon's parallel attention + MLP, reduced to its shape: two column->row regions whose closers'
    outputs are summed in place."""

    def __init__(self, d=8, f=16):
        super().__init__()
        self.up, self.down = nn.Linear(d, f), nn.Linear(f, d)           # the MLP region
        self.qkv, self.dense = nn.Linear(d, f), nn.Linear(f, d)         # the "attention" region

    def forward(self, x):
        mlp_output = self.down(torch.relu(self.up(x)))
        attention_output = self.dense(torch.tanh(self.qkv(x)))
        mlp_output += attention_output                 # in place on a row-split closer's output
        mlp_output *= 0.5                              # and again
        return mlp_output


STYLES = {"up": "colwise", "down": "rowwise", "qkv": "colwise", "dense": "rowwise"}
GROUPS = [["up", "down"], ["qkv", "dense"]]


def _reference():
    torch.manual_seed(0)
    m = ParallelBlock()
    x = torch.randn(4, 8)
    loss = m(x).pow(2).sum()
    loss.backward()
    return m, x, float(loss)


def _rank(rank, world, out_dir, store):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    code = 0
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
        from sapp.emit.tp import parallel
        ref, x, ref_loss = _reference()
        torch.manual_seed(0)
        m = ParallelBlock()
        mesh = init_device_mesh("cpu", (world,))
        sharded = parallel.apply_tp(m, STYLES, mesh, notes=[], groups=GROUPS)
        loss = m(x).pow(2).sum()
        loss.backward()
        diff = 0.0
        for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            diff = max(diff, float((g - q.grad).abs().max()))
        res = {"loss": float(loss), "ref": ref_loss, "grad_diff": diff, "sharded": sharded}
        dist.destroy_process_group()
    except BaseException as e:                 # noqa: BLE001 - reported to the test
        res, code = {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}, 1
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    os._exit(code)


def main(out_dir):
    import torch.multiprocessing as mp
    ctx = mp.start_processes(_rank, args=(2, out_dir, os.path.join(out_dir, "store")), nprocs=2, join=False,
                             start_method="fork")
    try:
        while not ctx.join():
            pass
    except Exception:                          # noqa: BLE001 - the ranks' files say what happened
        pass


def test_closer_output_modified_in_place_equals_one_process():
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "tests.test_tp_inplace", tmp], cwd=ROOT, timeout=120, check=False,
                       env=dict(os.environ, PYTHONPATH=ROOT))
        got = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(2)]
    for g in got:
        assert "error" not in g, g["error"]
        assert g["sharded"] == ["dense", "down", "qkv", "up"]
        assert abs(g["loss"] - g["ref"]) <= 1e-5 * abs(g["ref"])
        assert g["grad_diff"] <= 1e-5


class NormedEmbedding(nn.Embedding):
    """An HF embedding subclass with a norm inside (Inkling2NormedEmbedding): DTensor's Rowwise style
    registered its dotted 'embed_norm.weight' and emit stopped with KeyError "parameter name can't
    contain '.'"; a vocabulary split would also have normalised partial sums."""

    def __init__(self):
        super().__init__(16, 8)
        self.embed_norm = nn.LayerNorm(8)

    def forward(self, ids):
        return self.embed_norm(super().forward(ids))


def test_embedding_with_its_own_sub_module_parameters_runs_replicated_with_a_note():
    from sapp.emit.tp import parallel
    m = nn.Module()
    m.emb, m.head = NormedEmbedding(), nn.Linear(8, 16)
    notes = []
    plan = parallel._derived_styles(m, dict(m.named_modules()), {"emb": "vocab", "head": "colwise_gather"},
                                    [["emb"], ["head"]], None, notes, dry=True)
    assert plan == {"head": "colwise_gather"}
    assert notes == ["tp region emb .. runs replicated: emb is a NormedEmbedding, and DTensor splits only Linear and "
                     "Embedding (without sub-modules' parameters)"]


def test_layout_does_not_split_a_table_with_a_norm_inside():
    """The search side (sapp/search/tp_layout.py, sp_layout.vocab_split): such a table is never priced
    as vocabulary-split, so the plan does not promise what the emitter cannot run (the manifest
    refused it: 'the emitted program differs from the plan')."""
    from sapp.capture import capture
    from sapp.search import linears, tp_layout
    from sapp.search.sp_layout import vocab_split
    m = nn.Module()
    m.emb, m.head = NormedEmbedding(), nn.Linear(8, 16)
    m.forward = lambda ids: m.head(m.emb(ids))
    g = capture(m, (torch.randint(0, 16, (2, 4)),))
    emb = next(n for n, node in g.nodes.items() if node.kind == "embedding")
    assert "emb" in linears.nested_holders(g)
    assert tp_layout.emittable(g, {emb: "v"}, 2)[0][emb] is None
    assert vocab_split(g, {}, 2).get(emb) is None


if __name__ == "__main__":
    main(sys.argv[1])
