"""Pipeline pre-flight (sapp/emit/checks/preflight.py) and the repairs of sapp/emit/pp/graph_fix.py, in one
process: a split torch cannot run is one PlanError line naming the stage and module and saying what to
change; HF models' stages run (rotary embeddings under no_grad, a sub-module named `self`, strided
outputs) and compute what the whole model does, gradients included."""
import os
import sys

import pytest
import torch
from torch import nn

from sapp.emit.pp import pipe
from sapp.errors import PlanError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        x.mul_(0.5)         # in place on its input: fine inside one graph, not on a stage's received input
        return self.lin(x)


class Net(nn.Module):
    def __init__(self, layers=None):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.layers = nn.ModuleList(layers or [nn.Linear(8, 8), Scale()])

    def forward(self, x):
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return h


def test_split_that_torch_cannot_run_is_one_line_naming_the_module():
    torch.manual_seed(0)
    with pytest.raises(PlanError) as e:
        pipe.trace(Net(), (torch.randn(2, 8),), ["layers.1"])
    msg = str(e.value)
    assert "\n" not in msg
    assert "pipeline stage 1 of 2" in msg and "before 'layers.1'" in msg
    assert "in module 'layers.1'" in msg and "pin pp=1" in msg


def test_same_model_splits_elsewhere():
    torch.manual_seed(0)
    m = Net()
    x = torch.randn(2, 8)
    traced = pipe.trace(m, (x,), ["layers.0"])
    s0, s1 = (pipe.stage_modules(traced, [0, 1])[i] for i in (0, 1))
    with torch.no_grad():
        out = s1(s0(x.clone()))
        ref = m(x.clone())
    assert torch.allclose(out if torch.is_tensor(out) else out[0], ref, atol=1e-6)


@pytest.mark.parametrize("kind", ["llama", "bert", "vit"])
def test_hf_stages_run_and_match_the_whole_model(kind):
    pytest.importorskip("transformers")
    from sapp.emit.recompute.checkpointing import block_names
    from tests.emit_workers import hf_models
    model, _ = hf_models.build(kind)
    model.eval()
    blocks = block_names(model)
    x, _ = hf_models.batch(kind, 2, 0)
    traced = pipe.trace(model, x, [blocks[len(blocks) // 2]])
    stages = pipe.stage_modules(traced, [0, 1])
    with torch.no_grad():
        h = stages[0](*x)
        h = h if isinstance(h, tuple) else (h,)
        assert all(t.is_contiguous() for t in h)          # gloo's isend refuses strided tensors
        # only the hidden state crosses: the masks (and Llama's rotary cos/sin), built from positions
        # before the first layer, are computed again by stage 1 (sapp/emit/pp/stage_local.py)
        assert len(h) == 1 and h[0].dim() == 3 and h[0].shape[-1] == hf_models.HIDDEN, [t.shape for t in h]
        out = stages[1](*h)
        ref = model(*x).logits
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert torch.allclose(out, ref, atol=1e-5)


def test_run_precheck_refuses_a_split_torch_cannot_run_on_meta():
    from sapp.emit.checks import plan as checks
    from tests.emit_workers.plans import make_plan
    with torch.device("meta"):
        m = Net()
    plan = make_plan(params=1, pp=2, schedule="1f1b", micro_batches=2, split_before=["layers.1"], global_batch=4)
    with pytest.raises(PlanError, match=r"stage 1 of 2 .* in module 'layers.1'"):
        checks.check_pipeline_split(m, plan, (torch.empty(4, 8, device="meta"),))
    checks.check_pipeline_split(m, make_plan(params=1))          # pp = 1: nothing to check


class Pick(nn.Module):
    """Like DeepSeek-V3.2's sparse-attention indexer (also dots3, glm_moe_dsa): scores under no_grad,
    reading `h.to(<h's own dtype>)`, which eager returns as `h` itself."""

    def __init__(self):
        super().__init__()
        self.score = nn.Linear(8, 1)

    @torch.no_grad()
    def forward(self, h):
        return self.score(h.to(self.score.weight.dtype)).squeeze(-1).argmax(-1)


class PickBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.pick = nn.LayerNorm(8), Pick()
        self.lin, self.gate = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = self.norm(x)
        idx = self.pick(h)
        out = x + self.lin(h) * self.gate(h).sigmoid()       # h used again after the no-grad region
        return out + out.gather(1, idx[:, None, None].expand(-1, 1, 8))


def test_a_no_grad_region_handing_back_its_input_keeps_the_callers_gradient():
    """Export records the uses of `h` after `h.to(h.dtype)` inside no_grad as uses of the region's
    output; inlining the region detached that output, so the norms got no gradient and every earlier
    parameter a wrong one (dots3_note_text pp2: losses off by 5e-5 from step 1, no error)."""
    torch.manual_seed(0)
    m = Net([PickBlock(), PickBlock()])
    x = torch.randn(2, 5, 8)
    m(x).square().sum().backward()
    ref = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    stages = pipe.stage_modules(pipe.trace(m, (x,), ["layers.1"]), [0, 1])
    s0, s1 = stages[0], stages[1]
    h = s0(x)
    h = h if torch.is_tensor(h) else h[0]
    received = h.detach().requires_grad_()
    out = s1(received)
    (out if torch.is_tensor(out) else out[0]).square().sum().backward()
    h.backward(received.grad)
    got = {}
    for s in (s0, s1):
        got.update({n.replace(".", "_"): p.grad for n, p in s.named_parameters()})
    assert len(ref) == 14
    for name, g in ref.items():
        mine = [v for k, v in got.items() if k.endswith(name.replace(".", "_"))]
        assert mine and mine[0] is not None, f"{name} got no gradient in its stage"
        assert torch.allclose(mine[0], g, atol=1e-5), name


class GlobalBranch(nn.Module):
    """Longformer / LED: `if is_global_attn:` on the inputs' values before the blocks.  Capture takes
    the branch as the example takes it (it prices the graph); a traced stage would keep that branch
    for every later batch, so the split is refused before any step."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])

    def forward(self, x):
        if (x > 3).any():
            x = x * 0.5
        for m in self.layers:
            x = m(x)
        return x


def test_a_branch_on_values_is_refused_for_a_pipeline_in_one_line():
    with pytest.raises(PlanError) as e:
        pipe.trace(GlobalBranch(), (torch.randn(2, 8),), ["layers.1"])
    msg = str(e.value)
    assert "\n" not in msg and "branches on tensor values" in msg and "pin pp=1" in msg
