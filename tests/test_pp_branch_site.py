"""A pipeline refused for a branch on tensor values names the model's own line (issue 51, item 6):
TabTransformer's forward runs `if is_special_token.any():` before its first layer (special category
tokens are negative ids), a branch one traced stage would fix to the example batch's side.  The
refusal said only "its forward branches on tensor values (GuardOnDataDependentSymNode: Could not
guard on data-dependent expression Eq(u0, 1) ...", which names no line of the model; now it names
the file, line and code of the branch."""
import os
import sys

import pytest
import torch
from torch import nn

from sapp.emit.pp import pipe
from sapp.errors import PlanError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


class SpecialTokens(nn.Module):
    """Negative ids pick a special embedding, as TabTransformer does, before the layers."""

    def __init__(self):
        super().__init__()
        self.emb, self.special = nn.Embedding(10, 8), nn.Embedding(2, 8)
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, ids):
        h = self.emb(ids.clamp_min(0))
        if (ids < 0).any():
            h = torch.where((ids < 0)[..., None], self.special((ids + 1).abs().clamp_max(1)), h)
        for layer in self.layers:
            h = layer(h)
        return h


def test_the_refusal_names_the_models_branching_line():
    with pytest.raises(PlanError) as e:
        pipe.trace(SpecialTokens(), (torch.randint(0, 10, (2, 4)),), ["layers.1"])
    msg = str(e.value)
    assert "\n" not in msg and "pin pp=1" in msg, msg
    assert "test_pp_branch_site.py:" in msg and "if (ids < 0).any():" in msg, msg


def test_tab_transformer_pp2_is_refused_at_search_naming_its_branch():
    pytest.importorskip("tab_transformer_pytorch")
    from sapp.api import search
    from sapp.errors import SappError
    from tests.emit_workers import lib_models
    model, loss_fn = lib_models.build("lib:tab_transformer")
    x, y = lib_models.batch("lib:tab_transformer", 4, 0)
    with pytest.raises(SappError) as e:
        search(model, "cpu:gpus=2", global_batch=4, example_inputs=x, loss_fn=loss_fn, targets=y,
               constraints={"dp": 1, "tp": 1, "pp": 2, "zero": 0, "micro_batches": 2})
    msg = str(e.value)
    assert "\n" not in msg and "pp=2" in msg and "pin pp=1" in msg, msg
    assert "tab_transformer_pytorch.py:" in msg and "is_special_token.any()" in msg, msg
