"""Megatron sequence parallelism (SP) in the cost model: Korthikanti et al. 2022, Table 2, exactly, for a
captured zoo GPT layer (fp16 widths everywhere and 1-byte dropout masks, as the paper counts:
CostSettings(autocast_fp32=False)); the collectives SP trades the all-reduce for; the stage boundary;
the search's sp choice and the plan field."""
import pytest

from sapp import models
from sapp.capture import capture
from sapp.cluster import Cluster
from sapp.costmodel import CostSettings, collective_time
from sapp.pipeline.profile import build_profile
from sapp.search import sp_layout, tp_layout

PAPER = CostSettings(autocast_fp32=False)
A100 = Cluster.parse("a100-80g:nodes=1")
SHAPES = [(2048, 4096, 32), (1024, 1536, 16)]     # (s, h, a)


@pytest.fixture(scope="module", params=SHAPES, ids=lambda x: f"s{x[0]}h{x[1]}a{x[2]}")
def layer_graph(request):
    s, h, a = request.param
    return (s, h, a), capture(models.get("gpt-tiny", l=2, h=h, a=a, s=s, V=512, ffn=4 * h), batch=4)


def _layer(graph, t, sp):
    prof = build_profile(graph, A100, PAPER, 1, t, search_fn=tp_layout.search_fn, sp=sp)
    return prof, next(u for u in prof.units if u.name == "layers.1")


@pytest.mark.parametrize("t,sp", [(1, False), (2, False), (4, False), (8, False), (2, True), (4, True), (8, True)])
def test_korthikanti_table2_exact(layer_graph, t, sp):
    (s, h, a), g = layer_graph
    _, layer = _layer(g, t, sp)
    for b in (1, 2, 4):
        none, sel, full = layer.at(b, 0)[2]
        sbh = s * b * h
        if t == 1:
            ref = sbh * (34 + 5 * a * s / h)
        elif sp:
            ref = sbh * (34 / t + 5 * a * s / (h * t))
        else:
            ref = sbh * (10 + 24 / t + 5 * a * s / (h * t))
        assert none == pytest.approx(ref, rel=1e-9)
        # selective recomputation drops exactly the 5as/h term (divided by t)
        assert sel == pytest.approx(ref - sbh * 5 * a * s / (h * t), rel=1e-9)
        # full recomputation keeps the layer input: 2sbh, sequence-sharded under SP
        assert full == pytest.approx(2 * sbh / (t if sp else 1), rel=1e-9)


def test_sp_trades_all_reduce_for_all_gather_and_reduce_scatter(layer_graph):
    """Per layer and direction: TP has 2 all-reduces of the s*b*h activation; SP has 2 all-gathers +
    2 reduce-scatters (same bandwidth on a ring) and, in backward, 2 more all-gathers for the re-gathered
    inputs of the region entries (what Megatron does: the entry keeps its sequence shard)."""
    (s, h, a), g = layer_graph
    t, b = 8, 1
    nbytes = 2 * s * b * h
    _, tp_l = _layer(g, t, False)
    _, sp_l = _layer(g, t, True)
    ar = collective_time("all_reduce", nbytes, t, "intra", A100)
    ag = collective_time("all_gather", nbytes, t, "intra", A100)
    rs = collective_time("reduce_scatter", nbytes, t, "intra", A100)
    assert tp_l.reshard_at(b) == pytest.approx(2 * 2 * ar, rel=1e-6)
    assert sp_l.reshard_at(b) == pytest.approx(2 * 2 * (ag + rs) + 2 * ag, rel=1e-6)


def test_sp_choice_covers_residual_stream_only(layer_graph):
    (s, h, a), g = layer_graph
    prof, _ = _layer(g, 4, True)
    t1 = prof.template
    lv = prof.roles.index("tp")
    sp = sp_layout.sp_nodes(t1, prof.strategies, lv, 4)
    kinds = {t1.nodes[n].module or "<block>" for n in sp}
    # norms, the dropouts after the row-split closers and the embedding's, the residual adds, ln_f
    assert {"layers.0.ln1", "layers.0.ln2", "layers.0.attn.resid_drop", "layers.0.mlp.drop", "ln_f",
            "embed.drop"} <= kinds
    for n in sp:     # all split along the sequence, never inside attention (4-D) or the MLP's 4h
        node = t1.nodes[n]
        d = prof.strategies[n][lv]
        assert node.out.dims.index(d) == 1 and len(node.out.dims) == 3 and node.out.shape[2] == h
    # regions are unchanged by SP; the token table is split by vocabulary as Megatron's SP runs it
    # (sp_layout.vocab_split, issue 29), its partial sums reduce-scattered into the sequence shards
    prof_tp, _ = _layer(g, 4, False)
    for n, st in prof_tp.strategies.items():
        if t1.nodes[n].module == "embed.tok":
            assert prof.strategies[n][lv] == "v"
        elif n not in sp:
            assert prof.strategies[n] == st


def test_stage_boundary_sends_sequence_shard(layer_graph):
    (s, h, a), g = layer_graph
    for t in (2, 8):
        _, tp_l = _layer(g, t, False)
        _, sp_l = _layer(g, t, True)
        for b in (1, 3):
            full = 2 * s * b * h          # fp16 [b, s, h] per tp rank without SP (the replica)
            assert tp_l.at(b, 0)[4] == pytest.approx(full)
            assert sp_l.at(b, 0)[4] == pytest.approx(full / t)


def test_search_pins_sp_plan_roundtrip_and_explain(tmp_path):
    import sapp
    from sapp.errors import ConstraintError, PlanError
    from sapp.plan import Plan
    from sapp.report import explain
    from tests.emit_workers.sp_plans import forced_plan
    cl = "a100-80g:nodes=1"
    args = dict(l=4, h=256, a=8, s=256, V=1024)
    model = models.get("gpt-tiny", **args)
    # Megatron's regions forced (at this size the sharding search shards nothing)
    on, off = (forced_plan("gpt-tiny", world=8, cluster=cl, global_batch=16, model_args=args,
                           constraints={"tp": 4, "sp": sp}, precision="bf16-mixed") for sp in (True, False))
    assert on["parallel"]["sp"] is True and off["parallel"]["sp"] is False
    # SP holds less activation memory; the plans differ in the splits of the residual stream only, and
    # the token table, split by vocabulary under SP (sp_layout.vocab_split)
    assert on["predicted"]["memory"]["activations"] < off["predicted"]["memory"]["activations"]
    diff = [n for n in on["operators"] if on["operators"][n]["split"] != off["operators"][n]["split"]]
    tok = [n for n in diff if on["operators"][n]["module"] == "embed.tok"]
    assert len(tok) == 1 and on["tp_modules"]["embed.tok"] == "vocab"
    assert diff and all(on["operators"][n]["kind"] in sp_layout.SP_KINDS for n in diff if n not in tok)
    path = tmp_path / "sp.json"
    on.save(path)
    back = Plan.load(path)
    ev = sapp.evaluate(model, cl, back)
    assert ev["step_time_s"] == pytest.approx(on["predicted"]["step_time_s"], rel=1e-5)     # 6 digits
    assert ev["peak_memory_bytes"] == pytest.approx(on["predicted"]["peak_memory_bytes"], rel=1e-5)
    assert "sequence parallel on" in explain(back)
    # an old plan without the field loads as sp off; sp on without tp is refused with the field named
    d = off.to_dict()
    del d["parallel"]["sp"]
    assert Plan(d)["parallel"].get("sp", False) is False
    d = on.to_dict()
    d["parallel"].update(dp=d["parallel"]["dp"] * d["parallel"]["tp"], tp=1)
    with pytest.raises(PlanError, match="parallel.sp"):
        Plan(d)
    with pytest.raises(ConstraintError, match="sp"):
        sapp.search(model, cl, global_batch=16, constraints={"tp": 1, "sp": True})
    # the free search weighs both
    free = forced_plan("gpt-tiny", world=8, cluster=cl, global_batch=16, model_args=args, constraints={"tp": 4},
                       precision="bf16-mixed")
    assert free["predicted"]["step_time_s"] <= min(on["predicted"]["step_time_s"], off["predicted"]["step_time_s"]) * (1 + 1e-9)


def test_partition_keeps_a_block_entry_cut_on_the_first_stage():
    """SP cut at the first block's entry (HF decoders): that block stays with the prologue on stage 0, or
    the boundary before it would send the whole activation priced as the 1/t shard.  The exact program
    (evaluate._partition) is given a stage price that makes a prologue-only first stage cheapest."""
    from types import SimpleNamespace as NS
    from sapp.pipeline.profile import BLOCK_ENTRY
    from sapp.search.joint.evaluate import _partition
    units = [NS(kind="glue", cut_before=False), NS(kind="block", cut_before=True),
             NS(kind="block", cut_before=True), NS(kind="glue", cut_before=False)]

    def seg(i, a, b):          # a first stage holding a block is dear: plain min-max cuts before block 0
        return (10.0 if i == 0 and b > 1 else 1.0), True
    ctx, cfg = NS(stage_pins=None, uniform=True, L=2), NS(pp=2, schedule="1f1b", v=1)
    for method, first_stage_end in (("megatron+sp", 1), ("megatron+sp" + BLOCK_ENTRY, 2)):
        ev = NS(n=4, units=units, seg=seg, prof=NS(method=method))
        assert _partition(ctx, ev, cfg, exact=True) == [0, first_stage_end]
