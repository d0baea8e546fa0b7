"""The memory rules the truth matrix (tests/test_truth_matrix.py) rests on, each measured on its own:
what torch keeps, read with saved-tensor hooks (sapp/emit/runtime/memory_meter.py) on one small module, next to
a hand count and to the cost model's rule for it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from sapp.cluster import PRESETS
from sapp.costmodel import CostSettings, saved_activations
from sapp.emit.runtime.memory_meter import MemoryMeter
from sapp.cluster.mesh import Mesh
from sapp.recompute.solver import POLICIES
from sapp.search.joint.numbers import gathered_params, held_states, zero3_gathered
from sapp.search.joint.stage import StageEvaluator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, D = 8, 64
U = B * D * 4           # one fp32 (B, D) activation


def _meter(model):
    return MemoryMeter(SimpleNamespace(modules=[model], optimizers=[], grad_hooks=[]))


# ---- dropout -------------------------------------------------------------------------------------
class _Drop(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.lin, self.drop = nn.Linear(D, D), nn.Dropout(p)

    def forward(self, x):
        return self.drop(self.lin(x))


@pytest.mark.parametrize("p", [0.1, 0.0])
def test_cpu_dropout_keeps_noise_at_the_input_width(p):
    torch.manual_seed(0)
    m = _Drop(p).train()
    with _meter(m) as meter:
        m(torch.randn(B, D)).sum().backward()
    # the linear keeps its input (U); CPU dropout (unfused: input * bernoulli noise / (1 - p)) keeps the
    # noise, fp32 like its input (U); with p = 0 dropout returns its input and keeps nothing
    assert meter.peak_act == U + (U if p > 0 else 0)


def test_cost_model_prices_dropout_as_the_device_runs_it():
    from sapp.api import capture_graph
    g, _ = capture_graph(_Drop(0.1).train(), torch.randn(B, D), None, None)
    strat = {n: () for n in g.nodes}
    mesh = Mesh.for_devices(PRESETS["cpu"], 1)

    def mask_bytes(**kw):
        saved = saved_activations(g, strat, mesh, CostSettings(precision="fp32", **kw))
        return sum(b for tid, (b, _) in saved.items() if tid.endswith(":mask"))
    assert mask_bytes(dropout_noise=True) == U              # the cpu preset (fused_dropout False)
    assert mask_bytes() == B * D                              # CUDA's native_dropout: a bool mask
    assert not PRESETS["cpu"].fused_dropout and PRESETS["a100-80g"].fused_dropout


# ---- recompute transient -------------------------------------------------------------------------
class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)))


class _Stage(nn.Module):
    """block0 (kept), block1 (full recompute), loss = mean(y^2)."""

    def __init__(self):
        super().__init__()
        self.b0, self.b1 = _Block(), _Block()

    def forward(self, x):
        y = checkpoint(self.b1, self.b0(x), use_reentrant=False)
        return y.pow(2).mean()


def test_full_recompute_transient_is_the_block_less_what_backward_freed_after_it():
    torch.manual_seed(0)
    m = _Stage()
    with _meter(m) as meter:
        m(torch.randn(B, D)).backward()
    # stashes: block0 keeps x, a(x), gelu (3U); block1 its input (U); the loss pow keeps y (U): 5U after
    # forward.  Backward frees y, then recomputes block1: its input again (the same storage) + 2U.
    assert meter.peak_act == 6 * U
    # the cost model: acts (none, selective, full) per unit, in forward order
    ev = object.__new__(StageEvaluator)
    ev.units = [SimpleNamespace(kind="block", name="b0"), SimpleNamespace(kind="block", name="b1"),
                SimpleNamespace(kind="glue", name="loss")]
    ev.num = SimpleNamespace(act=[(3 * U, 3 * U, U), (3 * U, 3 * U, U), (U, U, U)], pbytes=[0.0] * 3,
                             live=[0.0] * 3,      # no loss-backward bytes beyond the stash (eager profile)
                             fsdp_held=0.0)       # nor FSDP2 buffers beside gathered parameters
    ev.cfg = SimpleNamespace(zero=0, pp=1, m=1)
    ev.allowed = lambda u: POLICIES if u.kind == "block" else ("none",)
    stash = 3 * U + U + U
    assert stash + ev.transient(range(3), {"b0": "none", "b1": "full"}) == meter.peak_act
    # both recomputed: block0's recomputation runs after block1's stash and the loss's are freed
    # (block1's 2U over the loss's U; block0's 2U over block1's U + the loss's U: nothing)
    assert ev.transient(range(3), {"b0": "full", "b1": "full"}) == U


# ---- FSDP2 (2 gloo ranks) ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fsdp():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.run([sys.executable, "-m", "tests.emit_workers.fsdp_memory_job", out], cwd=ROOT,
                              capture_output=True, text=True, timeout=180, env=env)
        assert os.path.exists(out), proc.stderr[-2000:]
        with open(out) as f:
            res = json.load(f)
    assert "error" not in res, res.get("error")
    return res


P_BLOCK, P_HEAD = (D * D + D) * 4, (D * 4 + 4) * 4         # fp32 Linear(D, D) blocks, Linear(D, 4) head


def test_fsdp2_zero2_holds_the_gathered_copy_from_forward_to_backward(fsdp):
    r = fsdp["zero2"]
    whole = 2 * P_BLOCK + P_HEAD
    assert r["params"] == pytest.approx(whole / 2, rel=0.02)       # the shards (dim-0 split of 2 ranks)
    assert r["gathered_after_forward"] == whole                      # every unit still gathered
    cfg = SimpleNamespace(zero=2, pp=1, m=1)
    units = [SimpleNamespace(kind="block"), SimpleNamespace(kind="block"), SimpleNamespace(kind="glue")]
    assert gathered_params(units, [P_BLOCK, P_BLOCK, P_HEAD], cfg) == whole


def test_fsdp2_zero3_gathers_the_root_one_block_and_the_prefetched_one_in_backward(fsdp):
    r = fsdp["zero3"]
    # the emitter shards the root with reshard_after_forward=True as well: nothing gathered after forward
    assert r["gathered_after_forward"] == 0
    # in backward: the root (gathered by its pre-backward, resharded by its post-backward, the last),
    # the block whose backward runs and the one FSDP2's backward prefetch gathers meanwhile (the block
    # before it; the meter counts its flat all-gather buffer): block1's backward holds the head, block1
    # and block0; block0's backward (it unpacks last) the head and block0 only
    assert r["gathered_in_first_block_backward"] == P_HEAD + P_BLOCK
    assert r["gathered_in_backward_max"] == P_HEAD + 2 * P_BLOCK
    cfg = SimpleNamespace(zero=3, pp=1, m=1)
    units = [SimpleNamespace(kind="block"), SimpleNamespace(kind="block"), SimpleNamespace(kind="glue")]
    assert gathered_params(units, [P_BLOCK, P_BLOCK, P_HEAD], cfg) == 0
    # block0: root + itself; block1: root + itself + block0 (prefetched); the head (root, first in
    # backward): root + block1 (prefetched by the root's pre-backward)
    assert zero3_gathered(units, [P_BLOCK, P_BLOCK, P_HEAD], cfg) == [P_HEAD + P_BLOCK, P_HEAD + 2 * P_BLOCK,
                                                                      P_HEAD + P_BLOCK]


def test_fsdp2_accumulation_holds_unsharded_gradients_at_the_next_forward(fsdp):
    r = fsdp["accumulate"]
    whole = 2 * P_BLOCK + P_HEAD
    assert r["grads_second_forward"] == whole             # unsharded accumulators, no shards yet
    assert r["grads_at_step"] == pytest.approx(whole / 2, rel=0.02)   # reduce-scattered, accumulators freed
    unit = SimpleNamespace(states={0: {"params": 4.0, "grads": 4.0, "optimizer": 8.0},
                                   1: {"params": 4.0, "grads": 4.0, "optimizer": 4.0},
                                   2: {"params": 4.0, "grads": 2.0, "optimizer": 4.0},
                                   3: {"params": 2.0, "grads": 2.0, "optimizer": 4.0}})
    assert held_states(unit, SimpleNamespace(zero=2, m=4, pp=1)) == {"params": 2.0, "grads": 4.0, "optimizer": 4.0}
    assert held_states(unit, SimpleNamespace(zero=2, m=4, pp=1), False)["grads"] == 2.0


# ---- selective recomputation ---------------------------------------------------------------------
class _Attn(nn.Module):
    def __init__(self, d=D, s=16):
        super().__init__()
        self.qkv, self.proj, self.s = nn.Linear(d, 3 * d), nn.Linear(d, d), s

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(-2, -1) * 0.125, dim=-1)
        return self.proj(att @ v)


class _AttnBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = _Attn()

    def forward(self, x):
        return x + self.attn(x)


class _AttnModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([_AttnBlock()])

    def forward(self, x):
        return self.blocks[0](x).pow(2).mean()


def _unit_acts(model, x):
    from sapp.api import capture_graph
    from sapp.costmodel import first_savers
    from sapp.pipeline.profile import unit_activations
    g, _ = capture_graph(model, x, None, None)
    st = CostSettings(precision="fp32")
    mesh = Mesh.for_devices(PRESETS["cpu"], 1)
    strat = {n: () for n in g.nodes}
    block = [n for n, nd in g.nodes.items() if (nd.module or "").startswith("blocks.0")]
    return unit_activations(g, block, strat, mesh, st, first_savers(g, mesh, st))


def test_selective_recompute_rematerialises_only_the_attention_core():
    from sapp.emit.recompute.checkpointing import apply, priced_regions
    x = torch.randn(2, 16, D)
    torch.manual_seed(0)
    none, sel, _ = _unit_acts(_AttnModel(), x)
    peaks = {}
    for mode in ("none", "selective"):
        torch.manual_seed(0)
        m = _AttnModel()
        if mode == "selective":
            modes = {"blocks.0": "selective"}
            apply(m, modes, priced_regions(m, modes, (x,)))
        with _meter(m) as meter:
            m(x).backward()
        peaks[mode] = meter.peak_act
    scores = 2 * 16 * 16 * 4            # one (B, S, S) fp32 tensor: the softmax output
    # the core keeps the softmax output (its matmul keeps q and k, views of the qkv output kept anyway
    # for v): selective drops exactly that, and recomputing it in backward brings it back, after the
    # loss's stash (the block's output, the size of x) is freed
    assert none - sel == scores
    loss_stash = x.numel() * 4
    assert peaks["none"] == none + loss_stash
    # SAC also caches the output of every MUST_SAVE operator in the region, the attn module's output
    # (proj) too, which no backward keeps: one (B, S, D) more than the cost model's `sel` (not priced
    # yet: bench/RESULTS.md section 6).  The recomputed scores (2 KiB) come back after the loss's stash
    # (8 KiB) is freed: no transient above the forward peak.
    region_out = x.numel() * 4
    assert peaks["selective"] == max(sel + loss_stash, sel + scores) + region_out


def test_fsdp2_leaves_a_host_table_whole_and_ungathered(fsdp):
    from sapp.placement.cost import Table, embedding_host_cost
    r = fsdp["ignored"]
    assert r["gathered_after_forward"] == 2 * P_BLOCK + P_HEAD      # the table is not among FSDP's gathers
    assert r["table_local_bytes"] == 100 * D * 4                     # nor sharded
    # so a sparse table on the device is priced whole at every ZeRO stage (weights and Adam's moments,
    # emit.sparse keeps it outside FSDP), with the rows the micro-batch touched as its gradient, and
    # placing it on the host sheds exactly that
    st = CostSettings(precision="fp32")
    t = Table("table.weight", 100, D, 8)
    n, dp = 100 * D, 2
    whole = 4 * n + 8 * (D * 4 + 8) + 8 * n          # w + 8 touched rows (fp32 + int64 index) + m, v
    for zero in range(4):
        assert embedding_host_cost([t], PRESETS["cpu"], st, dp=dp, zero=zero).saved_bytes == whole
