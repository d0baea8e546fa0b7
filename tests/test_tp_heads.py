"""Tensor parallelism split by heads for attention that reshapes by sizes of the whole model (issue
51, item 5): nanoGPT's CausalSelfAttention (`c_attn(x).split(self.n_embd, dim=2)`, views by
`C // self.n_head` with C read off the whole-width input) and litgpt's llama layout (counts read from
one Config every layer shares; 0.4's fused `attn` interleaved per query group, 0.5's `qkv` split by
sizes), models in tests/emit_workers/heads_models.py as their repositories write them.  Nothing stored on the
module gives these a rank's value, so the search used to gather the attention (replicated on every
tp rank) and shard only the MLPs.  Now the attention runs with those reshapes at a rank's share
(sapp/emit/tp/local_shapes.py, checked op by op by the shape audit) and its projections are split:
under tp=2 and tp=2 with sequence parallelism, 2 gloo processes, 3 Adam steps in float64, against
one process trained the same way."""
import os

import pytest
import torch

from tests.emit_workers import heads_models as HM

FUSED = {"NanoGPT": "c_attn", "LitLlamaInterleaved": "attn", "LitLlamaSplit": "qkv"}


def _searched(cls, tmp_path, sp: bool):
    from sapp.api import search
    from sapp.emit.runtime.program import default_loss
    from tests.emit_workers import custom_sp_run
    with torch.device("meta"):
        meta = cls()
    x, y = custom_sp_run._data(cls, 0)
    plan = search(meta, custom_sp_run.TP_CLUSTER, global_batch=custom_sp_run.BATCH, example_inputs=(x,),
                  loss_fn=default_loss, targets=y, constraints={"dp": 1, "tp": 2, "pp": 1, "zero": 0, "sp": sp})
    path = os.path.join(tmp_path, "plan.json")
    plan.save(path)
    return plan, path


def _ranks(cls, path, tmp_path) -> dict:
    from tests.emit_workers.custom_sp_run import launch
    return launch(f"{HM.__file__}:{cls.__name__}", path, tmp_path, timeout=240)


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2+sp"])
@pytest.mark.parametrize("name", list(FUSED))
def test_attention_split_by_heads_equals_one_process(name, sp, tmp_path):
    from tests.emit_workers import custom_sp_run
    cls = getattr(HM, name)
    plan, path = _searched(cls, tmp_path, sp)
    styles = plan._d["tp_modules"]
    assert plan.parallel["tp"] == 2 and bool(plan.parallel.get("sp")) == sp, plan.parallel
    for i in range(2):
        attn = f"transformer.h.{i}.attn"
        assert styles.get(f"{attn}.{FUSED[name]}") == "colwise", styles
        assert styles.get(f"{attn}.{'c_proj' if name == 'NanoGPT' else 'proj'}") == "rowwise", styles
    assert not any("gathered" in n for n in plan._d["notes"]), plan._d["notes"]
    ref = custom_sp_run.single(cls)
    for rank, res in sorted(_ranks(cls, path, tmp_path).items()):
        losses = res["losses"]
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
        assert len(losses) == 3 and diff <= 1e-10, (rank, diff, losses, ref)


def test_only_calls_that_cannot_hold_at_a_ranks_shapes_are_rewritten():
    """A whole-width tensor keeps its call; this rank's share of the split axis gets the local sizes."""
    from sapp.emit.tp.local_shapes import Localised
    rule = {"view": {(4, 2, 4), (3, 2, 32)}, "expand": {(5, 1, 2)}, "split": {(2, (32, 32, 32))}}
    with Localised(rule, 2):
        assert [t.shape[-1] for t in torch.zeros(2, 8, 96).split(32, dim=2)] == [32, 32, 32]
        assert [t.shape[-1] for t in torch.zeros(2, 8, 48).split(32, dim=2)] == [16, 16, 16]
        assert tuple(torch.zeros(2, 8, 32).view(2, 8, 4, 8).shape) == (2, 8, 4, 8)
        assert tuple(torch.zeros(2, 8, 16).view(2, 8, 4, 8).shape) == (2, 8, 2, 8)
        assert tuple(torch.zeros(2, 8, 2, 8).reshape(2, 8, 32).shape) == (2, 8, 16)
        # litgpt 0.4's k.expand(B, n_query_groups, q_per_kv, T, hs): a rank holds 1 of the 2 groups
        assert tuple(torch.zeros(2, 1, 1, 8, 8).expand(2, 2, 2, 8, 8).shape) == (2, 1, 2, 8, 8)
        assert tuple(torch.zeros(2, 2, 1, 8, 8).expand(2, 2, 2, 8, 8).shape) == (2, 2, 2, 8, 8)
        assert tuple(torch.zeros(4, 8, 16).view(4, 8, 4, 8).shape) == (4, 8, 2, 8)    # another batch


def test_the_audit_passes_with_the_reshapes_at_a_ranks_share_and_says_so():
    """nanoGPT's attention at one rank's layer shapes: refused as it is (fix=False: nothing localised),
    run split by heads with a note once the shape audit localises its reshapes."""
    from sapp.emit.checks import shape_audit
    from sapp.errors import PlanError
    styles = {}
    for i in range(2):
        styles.update({f"transformer.h.{i}.attn.c_attn": "colwise", f"transformer.h.{i}.attn.c_proj": "rowwise"})
    groups = [[f"transformer.h.{i}.attn.c_attn", f"transformer.h.{i}.attn.c_proj"] for i in range(2)]
    ids = torch.zeros(2, HM.SEQ, dtype=torch.long, device="meta")
    with torch.device("meta"):
        model = HM.NanoGPT()
    with pytest.raises(PlanError, match="cannot run at one rank's shapes"):
        shape_audit.check(model, styles, groups, 2, (ids,), [], fix=False)
    notes = []
    assert shape_audit.check(model, styles, groups, 2, (ids,), notes, fix=True) > 0
    assert notes == ["tp: transformer.h.*.attn reshape by sizes of the whole model (read off the input or a shared "
                     "config): split by heads, those reshapes run at this rank's 1/2 (shape audit passed)"], notes
