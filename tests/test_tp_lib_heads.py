"""Tensor parallelism split by heads on the probe set's decoders beyond nanoGPT and litgpt (issue 51,
item 5): x-transformers' ALiBi and relative-position decoders (a per-head bias made outside the split
block, sliced to a rank's heads where it meets the scores: sapp/search/tp_sliced.py, its parameters'
gradient summed over tp), its qk-norm decoder (F.normalize reads the split for its shape only), its
grouped-query decoder (key heads repeated as `(r kvh)`: the queries' rows and the closer's columns put
in rank order, sapp/search/tp_regroup.py) and Performer's FAVOR+ (a projection repeated over a rank's
heads); and 4 query heads over 2 key heads, where a rank holds one key head and x-transformers' Attend
would take its one-key-head branch (other ops than captured): the repeat is done before Attend runs
(sapp/emit/tp/local_shapes.py `repeat_rules`).  tp=2 on 2 gloo processes, 3 Adam steps in float64, against one process trained the same way;
the plan is sapp's own search, its runnable check the emitter's shape audit."""
import importlib.util
import os

import pytest
import torch

for _lib in ("x_transformers", "performer_pytorch"):
    if importlib.util.find_spec(_lib) is None:
        pytest.skip(f"{_lib} is not installed (the probe extra)", allow_module_level=True)

from tests.emit_workers import lib_heads_models as LM  # noqa: E402

ATTN = {"XtAlibi": ("net.attn_layers.layers.{}.1", 0), "XtRelPos": ("net.attn_layers.layers.{}.1", 0),
        "XtQKNorm": ("net.attn_layers.layers.{}.1", 0), "XtGQA": ("net.attn_layers.layers.{}.1", 0),
        "XtLlama": ("net.attn_layers.layers.{}.1", 0),
        "PerformerCausal": ("net.performer.net.layers.{}.0.fn", 0)}


def _searched(cls, tmp_path):
    from sapp.api import search
    from sapp.emit.runtime.program import default_loss
    from tests.emit_workers import custom_sp_run
    with torch.device("meta"):
        meta = cls()
    x, y = custom_sp_run._data(cls, 0)
    plan = search(meta, custom_sp_run.TP_CLUSTER, global_batch=custom_sp_run.BATCH, example_inputs=(x,),
                  loss_fn=default_loss, targets=y, constraints={"dp": 1, "tp": 2, "pp": 1, "zero": 0, "sp": False})
    path = os.path.join(tmp_path, "plan.json")
    plan.save(path)
    return plan, path


def _equals_one_process(name, path, tmp_path):
    """The plan at `path` trains model `name` 3 steps on 2 gloo ranks equal to one process (float64)."""
    from tests.emit_workers import custom_sp_run
    ref = custom_sp_run.single(getattr(LM, name))
    ranks = custom_sp_run.launch(f"{LM.__file__}:{name}", path, tmp_path, timeout=240)
    for rank, res in sorted(ranks.items()):
        losses = res["losses"]
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
        assert len(losses) == 3 and diff <= 1e-10, (rank, diff, losses, ref)


@pytest.mark.parametrize("name", list(ATTN))
def test_attention_split_by_heads_equals_one_process(name, tmp_path):
    cls = getattr(LM, name)
    plan, path = _searched(cls, tmp_path)
    styles = plan._d["tp_modules"]
    assert plan.parallel["tp"] == 2, plan.parallel
    block = ATTN[name][0]
    for i in (0, 2) if name.startswith("Xt") else (0, 1):     # x-transformers: attention, ff, attention, ff
        attn = block.format(i)
        assert [styles.get(f"{attn}.{p}") for p in ("to_q", "to_k", "to_v", "to_out")] == \
            ["colwise"] * 3 + ["rowwise"], (attn, styles)
    assert not any("gathered" in n for n in plan._d["notes"]), plan._d["notes"]
    if name in ("XtGQA", "XtLlama"):    # the queries' rows and the closer's columns in rank order: 2 pieces
        parts = plan._d["tp_layout"]["parts"]   # (8 / 4 heads of 16; 4 / 2 heads of 8)
        w = 64 if name == "XtGQA" else 16
        assert parts[f"{block.format(0)}.to_q"] == [w, w] and parts[f"{block.format(0)}.to_out"] == [w, w], parts
    _equals_one_process(name, path, tmp_path)


@pytest.mark.parametrize("name", ["TorchEncoder", "TorchEncoderSeqFirst"])
def test_multihead_attention_split_by_heads_equals_one_process(name, tmp_path):
    """nn.MultiheadAttention (its own forward applies the packed in_proj_weight) split by heads: the plan
    names it 'heads' (sapp/search/tp_mha.py), the emitter runs its forward over a rank's heads
    (sapp/emit/tp/mha.py); batch-first and [seq, batch] layouts."""
    cls = getattr(LM, name)
    plan, path = _searched(cls, tmp_path)
    styles = plan._d["tp_modules"]
    assert [styles.get(f"encoder.layers.{i}.self_attn") for i in (0, 1)] == ["heads", "heads"], styles
    assert not any("gathered" in n for n in plan._d["notes"]), plan._d["notes"]
    _equals_one_process(name, path, tmp_path)


def test_attention_left_replicated_says_why():
    """Where the layout cannot split the heads, one line says why: nn.MultiheadAttention split 'heads'
    leaves no line, and at a tp its heads do not divide, the line says so; local-attention, whose heads
    ride the batch axis, leaves none at tp=2 once its to_qkv is split."""
    from sapp.capture import capture
    from sapp.search.tp_layout import unsplit_attention
    from tests.emit_workers import hf_models
    want = {("torch_encoder_lm", 3): ("encoder.layers.*.self_attn", "heads, which tp=3 does not divide")}
    for (case, tp), (module, why) in want.items():
        model, loss_fn = hf_models.build(f"lib:{case}", device="meta")
        x, y = hf_models.batch(f"lib:{case}", 2, 0)
        graph = capture(model, x, loss_fn=loss_fn, target=y)
        lines = unsplit_attention(graph, tp, {})
        assert any(line.startswith(f"{module}: ") and why in line for line in lines), (case, lines)
    model, loss_fn = hf_models.build("lib:torch_encoder_lm", device="meta")
    x, y = hf_models.batch("lib:torch_encoder_lm", 2, 0)
    heads = {m: "heads" for m, _ in model.named_modules() if m.endswith("self_attn")}
    lines = unsplit_attention(capture(model, x, loss_fn=loss_fn, target=y), 2, heads)
    assert heads and not any("self_attn" in line for line in lines), lines
    if importlib.util.find_spec("local_attention") is not None:
        model, loss_fn = hf_models.build("lib:local_transformer", device="meta")
        x, y = hf_models.batch("lib:local_transformer", 2, 0)
        graph = capture(model, x, loss_fn=loss_fn, target=y)
        lines = unsplit_attention(graph, 2, {})        # no Linear split: the region is valid, only kept whole
        assert lines and all("a region tp can split that this plan keeps whole" in line for line in lines), lines
        qkv = {m: "colwise" for m, _ in model.named_modules() if m.endswith("to_qkv")}
        assert qkv and unsplit_attention(graph, 2, qkv) == [], unsplit_attention(graph, 2, qkv)



def test_one_key_head_a_rank_repeated_before_the_branch(tmp_path, monkeypatch):
    """XtLlama's searched layout through the shape audit on meta: it passes with the key / value heads
    repeated before Attend runs, and the note says so; without that repeat Attend's one-key-head branch
    runs other ops than captured, and the refusal names the branch (the try that ran furthest, head
    counts already at a rank's share), not the einsum error of the try that set nothing."""
    from sapp.emit.checks import shape_audit
    from sapp.emit.tp import local_shapes
    from sapp.errors import PlanError
    from tests.emit_workers import custom_sp_run
    plan, _ = _searched(LM.XtLlama, tmp_path)
    styles, groups = plan._d["tp_modules"], plan._d["tp_layout"]["groups"]
    x, _ = custom_sp_run._data(LM.XtLlama, 0)
    with torch.device("meta"):
        model = LM.XtLlama()
    notes = []
    assert shape_audit.check(model, styles, groups, 2, (x.to("meta"),), notes) > 0
    assert any("key / value heads repeated to this rank's query heads" in n for n in notes), notes
    monkeypatch.setattr(local_shapes, "repeat_rules", lambda *a: {})
    with torch.device("meta"):
        model = LM.XtLlama()
    with pytest.raises(PlanError) as e:
        shape_audit.check(model, styles, groups, 2, (x.to("meta"),), [])
    msg = str(e.value)
    assert "runs other ops than captured" in msg and "branches on a size the split changes" in msg, msg
    assert "einsum" not in msg and "\n" not in msg, msg


@pytest.mark.parametrize("name", ["LocalWindows", "LocalWindowsHeadBias"])
def test_heads_folded_into_the_batch_split_by_heads(name, tmp_path):
    """local-attention packs q, k, v as `(b h) n d` for its windows (sapp/search/tp_fold.py): the searched
    tp=2 plan splits the fused to_qkv by heads (3 pieces) and to_out by rows in every block, leaves no
    attention replicated (the plan's notes name none), and trains equal to one process in float64; with
    the dynamic position bias (a per-head bias repeated over the folded batch) its MLP's last layer
    is split by heads too."""
    pytest.importorskip("local_attention")
    plan, path = _searched(getattr(LM, name), tmp_path)
    styles, parts = plan._d["tp_modules"], plan._d["tp_layout"]["parts"]
    assert plan.parallel["tp"] == 2, plan.parallel
    for i in (0, 1):
        attn = f"net.layers.{i}.0.branch"
        assert [styles.get(f"{attn}.to_qkv"), styles.get(f"{attn}.to_out")] == ["colwise", "rowwise"], styles
        assert parts[f"{attn}.to_qkv"] == [32, 32, 32], parts
    assert not any(n.startswith("tp=2 keeps the attention") for n in plan._d["notes"]), plan._d["notes"]
    if name == "LocalWindowsHeadBias":
        assert styles.get("net.dynamic_pos_bias.mlp.4") == "colwise", styles
    _equals_one_process(name, path, tmp_path)


def test_plan_names_the_attention_it_keeps_whole(tmp_path):
    """Where a layout keeps an attention whole, the searched plan's notes say which and why
    (plan/build.operator_section): LocalTransformer called with a key-padding mask, which local-attention
    repeats over the batch its heads are folded into, a tensor made outside whose rows are every head's;
    the plan keeps that attention replicated, splits the rest, and trains equal to one process."""
    pytest.importorskip("local_attention")
    plan, path = _searched(LM.LocalWindowsMasked, tmp_path)
    styles = plan._d["tp_modules"]
    assert plan.parallel["tp"] == 2 and styles.get("net.layers.0.1.branch.1"), styles     # the MLP keeps tp
    assert styles.get("net.layers.0.0.branch.to_qkv") in (None, "colwise_gather"), styles   # q, k, v whole
    assert "net.layers.0.0.branch.to_out" not in styles, styles
    line = [n for n in plan._d["notes"] if n.startswith("tp=2 keeps the attention net.layers.*.*.branch.attn_fn")]
    assert line and "whose rows are every head's" in line[0], plan._d["notes"]
    _equals_one_process("LocalWindowsMasked", path, tmp_path)
