"""Sequence parallelism where module registration order is not call order, and SP norms without
weights (issue 26, the transformers catalogue on torch 2.13):
- CamemBERT / XLM-RoBERTa register `lm_head` before `roberta`.  sp_entry's relayout (the embeddings'
  cut moved to the first block, since the model builds its attention mask from the embeddings'
  output) read the head as a module "before the blocks" reading the shard, and left the cut where
  it was: step 0 failed with "size of tensor a (16) must match the size of tensor b (8)", after every
  rank had set up.  The relayout now reads the order the shape audit's capture ran the modules in,
  and the SP audit (sapp/emit/checks/sp_audit.py) runs the model once at a rank's sequence shard before any
  step, so such a plan is refused in one line instead.
- OLMo's LayerNorm has no weights: the manifest read SP norms off their replicated DTensor weights
  and refused every tp2+sp plan as "the emitted program differs from the plan"."""
import pytest
import torch
from torch import nn

# the XLM-RoBERTa-XL case's sizes and blocks (custom_sp_run reads SEQ / VOCAB off this file)
from tests.test_sp_length_readers import BATCH, D, SEQ, VOCAB, Layer


class Embeddings(nn.Module):
    """BERT's: word + position, summed, then a LayerNorm (an SP norm before the blocks)."""

    def __init__(self):
        super().__init__()
        self.word, self.pos, self.LayerNorm = nn.Embedding(VOCAB, D), nn.Embedding(SEQ, D), nn.LayerNorm(D)

    def forward(self, ids):
        return self.LayerNorm(self.word(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device)))


class Body(nn.Module):
    """RobertaModel's shape: the mask is built from the embeddings' output length, then the blocks."""

    def __init__(self, layer=Layer):
        super().__init__()
        self.embeddings = Embeddings()
        self.layer = nn.ModuleList([layer(), layer()])

    def forward(self, ids):
        e = self.embeddings(ids)
        pos = torch.arange(e.shape[1], device=e.device)
        mask = torch.where(pos[None, :] <= pos[:, None], 0.0, -1e9)[None, None]
        for m in self.layer:
            e = m(e, mask)
        return e


class HeadFirst(nn.Module):
    """CamemBERT's registration order: the head before the body that runs first."""

    def __init__(self):
        super().__init__()
        self.lm_head = nn.Linear(D, VOCAB)
        self.body = Body()

    def forward(self, ids):
        return self.lm_head(self.body(ids))


class NoWeightLayer(Layer):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D, elementwise_affine=False), nn.LayerNorm(D, elementwise_affine=False)


class NoWeightNorms(nn.Module):
    """OLMo's norms: LayerNorm without weight or bias."""

    def __init__(self):
        super().__init__()
        self.body = Body(NoWeightLayer)
        self.lm_head = nn.Linear(D, VOCAB)

    def forward(self, ids):
        return self.lm_head(self.body(ids))


def test_head_registered_first_runs_equal_to_one_process(tmp_path):
    """tp=2 + SP, 2 gloo ranks, 3 steps: one process's losses (before: step 0 failed on the mask)."""
    from tests.emit_workers import custom_sp_run
    got, ref, plan = custom_sp_run.run(HeadFirst, tmp_path)
    sec = plan.tp_layout["sp"]
    assert "body.embeddings.LayerNorm" in sec["norms"] and "lm_head" in sec["entries"], sec
    assert len(got) == len(ref) == 3
    assert max(abs(a - b) / abs(b) for a, b in zip(got, ref)) <= 1e-5, (got, ref)


@pytest.mark.slow      # about 13 s; the head-registered-first case above runs the same SP machinery
def test_weightless_norms_run_equal_to_one_process(tmp_path):
    from tests.emit_workers import custom_sp_run
    got, ref, plan = custom_sp_run.run(NoWeightNorms, tmp_path)
    assert "body.layer.0.ln1" in plan.tp_layout["sp"]["norms"]
    assert len(got) == len(ref) == 3
    assert max(abs(a - b) / abs(b) for a, b in zip(got, ref)) <= 1e-5, (got, ref)


@pytest.fixture(scope="module")
def head_first_plan():
    from sapp.api import search
    from sapp.emit.runtime.program import default_loss
    from tests.emit_workers import custom_sp_run
    with torch.device("meta"):
        meta = HeadFirst()
    x, y = custom_sp_run._data(HeadFirst, 0)
    return search(meta, custom_sp_run.TP_CLUSTER, global_batch=BATCH, example_inputs=(x,), loss_fn=default_loss,
                  targets=y, constraints={"dp": 1, "tp": 2, "pp": 1, "sp": True, "zero": 0}), x


def _audit(plan, x):
    from sapp.emit.checks import plan as checks, shape_audit
    from sapp.emit.tp import sp
    torch.manual_seed(0)
    model, notes = HeadFirst(), []
    shape_audit.check(model, checks.tp_modules(plan), checks.tp_groups(plan), 2, (x,), notes,
                      sp_sec=sp.section(plan))
    return notes


def test_sp_audit_refuses_a_cut_the_mask_builder_reads(head_first_plan, monkeypatch):
    """With the call order withheld (registration order: the code before the fix), the embeddings'
    cut stays before the mask is built; the SP audit refuses the plan in one line naming the module,
    in this process, before any step or collective."""
    from sapp.emit.tp import sp_entry
    from sapp.errors import PlanError
    plan, x = head_first_plan
    assert _audit(plan, x) is not None                        # with the order: passes
    monkeypatch.setattr(sp_entry, "remember_order", lambda module, graph: None)
    with pytest.raises(PlanError) as e:
        _audit(plan, x)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("sequence parallelism tp=2: at one rank's sequence shard"), msg
    assert "'body.layer.0" in msg and "sp=false" in msg, msg


def test_relayout_reads_call_order_not_registration_order():
    """The unit under the runs above: a head registered first but called last is an entry after the
    blocks once the call order is known, so the cuts before the blocks move; without it, as before,
    nothing moves."""
    from types import SimpleNamespace
    from sapp.emit.tp import sp_entry
    from sapp.emit.recompute.checkpointing import block_names
    torch.manual_seed(0)
    m = HeadFirst()
    sec = {"scatter": {"body.embeddings.word": 1, "body.embeddings.pos": 0},
           "norms": {"body.embeddings.LayerNorm": 1, "body.layer.0.ln1": 1}, "entries": {"lm_head": 1},
           "exits": {}, "block_scatter": {}}
    assert sp_entry.relayout(sec, m, {}, block_names(m)) == (sec, [])          # registration order
    called = ["body.embeddings.word", "body.embeddings.pos", "body.embeddings.LayerNorm", "body.layer.0.ln1",
              "body.layer.0.attn.q", "body.layer.1.ln1", "lm_head"]
    sp_entry.remember_order(m, SimpleNamespace(nodes={i: SimpleNamespace(module=n) for i, n in enumerate(called)}))
    out, moved = sp_entry.relayout(sec, m, {}, block_names(m))
    assert moved == ["body.embeddings.LayerNorm", "body.embeddings.pos", "body.embeddings.word"]
    assert out["block_scatter"] == {"body.layer.0": 1} and out["entries"] == {"lm_head": 1}
    assert out["scatter"] == {} and out["norms"] == {"body.layer.0.ln1": 1}
