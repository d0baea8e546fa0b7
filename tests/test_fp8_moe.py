"""FP8 for the MoE experts, the blockwise recipe and the FP8 copies kept for backward (costmodel/fp8.py,
fp8_linears.py, memory.py, moe.py; search/joint/ep.py): Transformer Engine's recipes run the experts'
grouped GEMMs in FP8 (torchao's tensorwise swaps nn.Linear only: bf16 there), blockwise prices between
delayed and bf16, the EP reprice of the expert GEMMs keeps the FP8 times on both sides, and an FP8
linear keeps its input's FP8 copy (1 B an element, 1 + 4/128 blockwise) in place of the bf16 one."""
import types

import pytest

from sapp import api
from sapp.cluster import Cluster
from sapp.cluster.mesh import Mesh
from sapp.costmodel import CostSettings
from sapp.costmodel import fp8 as F
from sapp.costmodel import moe as cm
from sapp.costmodel.memory import saved_activations
from sapp.costmodel.nodes import node_cost
from sapp.errors import SappError
from sapp.search.joint.ep import moe_facts

H100 = "h100-80g:nodes=1"
RECIPES = ("", "tensorwise", "delayed", "blockwise")


def _settings(recipe):
    return CostSettings(fp8=recipe, runtime="fused")


@pytest.fixture(scope="module")
def mixtral():
    """Two Mixtral-8x7B layers (the experts' GEMMs at full width), and the same with half the experts."""
    return {e: api.capture_spec("mixtral-8x7b", {"l": 2, "experts": e})[3] for e in (8, 4)}


def _grouped(g):
    return [n for n in g.nodes.values() if F.is_fp8_grouped(n)]


def _one_rank(cl):
    mesh = Mesh.for_devices(cl, 1)
    return mesh, (None,) * len(mesh.levels)


def _cost(g, recipe, cl):
    mesh, st = _one_rank(cl)
    return {n.name: node_cost(n, st, mesh, cl, _settings(recipe)) for n in _grouped(g)}


def test_the_experts_grouped_gemms_run_fp8_under_te_recipes_and_bf16_under_torchao(mixtral):
    cl = Cluster.parse(H100)
    g = mixtral[8]
    nodes = _grouped(g)
    assert len(nodes) == 2 * 2 and not any(F.is_fp8_linear(n) for n in nodes)
    t = {r: _cost(g, r, cl) for r in RECIPES}
    rate = F.fp8_rate_ratio(cl)
    for n in nodes:
        bf, tw, de = t[""][n.name], t["tensorwise"][n.name], t["delayed"][n.name]
        # torchao's Float8Linear swaps nn.Linear only: the experts stay bf16
        assert (tw.fwd_s, tw.bwd_s) == (bf.fwd_s, bf.bwd_s)
        for a, b in ((de.fwd_s, bf.fwd_s), (de.bwd_s, bf.bwd_s)):
            # faster, never by more than the FP8 rate (the casts and the bf16 output are extra)
            assert 1.0 / rate < a / b < 1.0, (n.name, a / b)
        # the casts are in: above the same GEMM priced with no cast at all
        x, w, y = (sum(o.numel for o in n.operands if o.param is None and len(o.shape) >= 2),
                   sum(o.numel for o in n.operands if o.param is not None), n.out.numel)
        ov = cl.gemm_memory_overlap
        bare = F.fp8_gemm_times(n.flops, 2 * n.flops, x, w, y, ((0.0, 0), (0.0, 0)), cl, _settings("delayed"), True, ov)
        assert de.fwd_s > bare[0] and de.bwd_s > bare[1]
        # the FP8 weight and its transpose kept across micro-batches: 2 B an element beside the bf16 weight
        assert de.param_bytes - bf.param_bytes == pytest.approx(F.WEIGHT_CACHE_BYTES["delayed"] * w)


def test_blockwise_prices_between_delayed_and_bf16_and_mxfp8_is_refused(mixtral):
    cl = Cluster.parse(H100)
    g = mixtral[8]
    t = {r: _cost(g, r, cl) for r in ("", "delayed", "blockwise")}
    for name in t[""]:
        for side in ("fwd_s", "bwd_s"):
            d, b, bf = (getattr(t[r][name], side) for r in ("delayed", "blockwise", ""))
            assert d < b < bf, (name, side, d, b, bf)
    # the promotion overhead alone (no casts): blockwise's GEMM at BLOCKWISE_GEMM of delayed's rate, at most
    # the full 1 + PROMOTION slower on a compute-bound GEMM
    n = _grouped(g)[0]
    x, w, y = (n.operands[0].numel, n.operands[1].numel, n.out.numel)
    none = ((0.0, 0), (0.0, 0))
    ov = cl.gemm_memory_overlap
    d, b = (F.fp8_gemm_times(n.flops, 2 * n.flops, x, w, y, none, cl, _settings(r), True, ov) for r in ("delayed", "blockwise"))
    assert 1.0 < b[0] / d[0] <= 1.0 + F.PROMOTION + 1e-9 and 1.0 < b[1] / d[1] <= 1.0 + F.PROMOTION + 1e-9
    with pytest.raises(SappError) as e:
        CostSettings(fp8="mxfp8")
    assert "Blackwell" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SappError, match="Blackwell"):
        api.search("llama-tiny", H100, global_batch=8, fp8="mxfp8")


# ---- expert parallelism --------------------------------------------------------------------------------
def _facts(g, recipe):
    return moe_facts(types.SimpleNamespace(graph=g, settings=_settings(recipe)))


@pytest.mark.parametrize("recipe", ["", "delayed", "blockwise"])
def test_an_ep_rank_prices_its_experts_as_a_model_with_that_many_experts(mixtral, recipe):
    """At balanced load and tp 1 an EP rank runs the same rows through E/ep experts: the ep = 1 profile
    (node_cost of the captured GEMMs) plus expert_gemm_delta must equal node_cost of the same GEMMs
    captured with E/ep experts, in FP8 as in bf16 (the delta priced with the FP8 times on both sides)."""
    cl = Cluster.parse(H100)
    s = _settings(recipe)
    full, half = mixtral[8], mixtral[4]
    B = full.batch_size
    c8, c4 = _cost(full, recipe, cl), _cost(half, recipe, cl)
    facts = _facts(full, recipe)
    assert len(facts) == 2
    for block, f in facts.items():
        mine = [n.name for n in _grouped(full) if n.block == block]
        other = [n.name for n in _grouped(half) if n.block == block]
        df, db = cm.expert_gemm_delta(f["gemms"], B, 2, 1, 1.0, cl, s, f["gemm_elems"])
        for side, d in (("fwd_s", df), ("bwd_s", db)):
            before = sum(getattr(c8[k], side) for k in mine)
            after = sum(getattr(c4[k], side) for k in other)
            assert before + d == pytest.approx(after, rel=1e-6), (block, side)
        # the weight-gradient half on the EP rank is priced in the same precision
        dw = cm.expert_wgrad_s(f["gemms"], B, 2, 1, 1.0, cl, s, f["gemm_elems"])
        assert dw == pytest.approx(sum(c4[k].bwd_s for k in other) / 2, rel=1e-6)
        assert cm.expert_gemm_delta(f["gemms"], B, 1, 1, 1.0, cl, s, f["gemm_elems"]) == (0.0, 0.0)


def test_a_pinned_ep_plan_trains_faster_with_fp8_experts(monkeypatch):
    # the bench's Mixtral-8x7B row (bench/published_moe.py): 64 H100, tp 1 pp 4 dp 16 ep 8, v 2, m 16, ZeRO-1
    pins = {"tp": 1, "pp": 4, "dp": 16, "ep": 8, "schedule": "interleaved", "virtual_chunks": 2,
            "micro_batches": 16, "zero": 1}
    g = api.capture_spec("mixtral-8x7b")[3]

    def step(recipe):
        p = api.search(g, "h100-80g:devices=64", global_batch=256, runtime="fused", fp8=recipe or None, constraints=pins)
        assert p["parallel"]["ep"] == 8
        return p["predicted"]["step_time_s"]
    t = {r: step(r) for r in ("", "delayed", "blockwise")}
    assert t["delayed"] < t["blockwise"] < t[""], t
    # no more than the FP8 rate on the whole step (attention, all-to-alls and the bubble stay)
    assert t[""] / t["delayed"] < F.fp8_rate_ratio(Cluster.parse("h100-80g:devices=64"))
    # the experts' share: the same plan with only the blocks' linears in FP8 (the grouped GEMMs and their
    # EP reprice at bf16, as before the experts ran FP8) is slower
    from sapp.costmodel import fp8_linears
    monkeypatch.setattr(fp8_linears, "GROUPED_FP8_RECIPES", ())
    monkeypatch.setattr(F, "grouped_fp8", lambda settings: False)
    dense_only = step("delayed")
    assert t["delayed"] < dense_only < t[""], (t, dense_only)


# ---- the FP8 copies kept for backward ----------------------------------------------------------------
@pytest.mark.parametrize("recipe", ["delayed", "blockwise"])
def test_an_fp8_linear_keeps_its_inputs_fp8_copy_and_a_bf16_tensor_another_op_keeps_stays(recipe):
    g = api.capture_spec("llama-tiny")[3]
    cl = Cluster.parse("h100-80g:nodes=1,gpus_per_node=1")
    mesh, one = _one_rank(cl)
    st = {n: one for n in g.nodes}
    bf = saved_activations(g, st, mesh, _settings(""))
    f8 = saved_activations(g, st, mesh, _settings(recipe))
    linear = {n.name for n in g.nodes.values() if F.is_fp8_linear(n)}
    # derived from the bf16 stash: what only FP8 linears kept goes; each activation they read (its
    # producer) is kept once more at the recipe's width (1 B, or 1 + 4/128 with the tile scales)
    gone = {k for k, (_, savers) in bf.items() if set(savers) <= linear}
    read = {o.producer for n in g.nodes.values() if n.name in linear for o in n.operands
            if o.param is None and o.producer is not None}
    width = F.CACHE_WIDTH[recipe]
    came = sum(g.nodes[p].out.numel * width for p in read)
    drop = sum(bf[k][0] for k in gone)
    assert gone and read
    assert sum(b for b, _ in bf.values()) - sum(b for b, _ in f8.values()) == pytest.approx(drop - came)
    assert {k for k in f8 if k.endswith(":fp8")} == {f"{p}:fp8" for p in read}
    # a tensor another op keeps (flash attention's output, which the output projection reads) stays, at bf16
    kept = [k for k, (_, savers) in bf.items() if set(savers) & linear and not set(savers) <= linear]
    assert kept
    for k in kept:
        assert f8[k][0] == bf[k][0] and not set(f8[k][1]) & linear
    # the plan's activation memory moves by exactly that (one stage, one micro-batch of the captured batch)
    pins = dict(dp=1, tp=1, pp=1, recompute="none", micro_batches=1)
    act = {r: api.search(g, cl, global_batch=g.batch_size, runtime="fused", fp8=r or None,
                         constraints=pins)["predicted"]["memory"]["activations"] for r in ("", recipe)}
    assert act[recipe] < act[""]
    assert act[""] - act[recipe] == pytest.approx(drop - came, rel=1e-4)


def test_the_experts_keep_their_fp8_copies_too(mixtral):
    g = mixtral[8]
    cl = Cluster.parse(H100)
    mesh, one = _one_rank(cl)
    st = {n: one for n in g.nodes}
    f8 = saved_activations(g, st, mesh, _settings("delayed"))
    tw = saved_activations(g, st, mesh, _settings("tensorwise"))
    for n in _grouped(g):
        x = n.operands[0]
        assert f8[f"{x.producer}:fp8"][0] == x.numel * 1.0          # the routed rows, 1 B an element
        assert f"{x.producer}:fp8" not in tw                        # torchao: the experts are bf16


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_the_fp8_weight_copies_are_kept_under_every_zero_stage(zero):
    """Transformer Engine's FP8 weight copies (costmodel/fp8.py WEIGHT_CACHE_BYTES) are bytes beyond the
    parameters that no ZeRO stage shards: the search's ZeRO > 0 profiles (pipeline/profile_fit.zero_numbers)
    re-derived the parameter bytes from the parameters alone and dropped them (llama-tiny on 8 H100:
    365,184 B of weights with delayed FP8 at ZeRO-0, 217,728 = bf16's at ZeRO-1)."""
    def params(z, fp8):
        kw = {"fp8": fp8} if fp8 else {}
        p = api.search("llama-tiny", "h100-80g:devices=8", global_batch=16,
                       constraints=dict(tp=1, pp=1, dp=8, zero=z), **kw)
        return p["predicted"]["memory"]["params"]
    cache = params(0, "delayed") - params(0, "")
    assert cache > 0
    assert params(zero, "delayed") - params(zero, "") == pytest.approx(cache)


def test_an_ep_rank_keeps_fp8_copies_of_its_own_experts_only():
    """Under EP a rank holds 1/ep of the experts, and so 1/ep of their FP8 weight copies (moe.ep_unit_delta):
    the copies (2 B an element under delayed scaling) can be no more than the rank's bf16 weights (2 B an
    element).  Pricing every expert's copy on every rank put 23.2 GB of copies beside Mixtral's 3.8 GB of weights."""
    pins = dict(tp=1, pp=4, dp=16, ep=8, schedule="interleaved", virtual_chunks=2, micro_batches=16, zero=1)

    def params(**kw):
        p = api.search("mixtral-8x7b", "h100-80g:devices=64", global_batch=256, runtime="fused",
                       constraints=pins, **kw)
        return p["predicted"]["memory"]["params"]
    bf16, delayed = params(), params(fp8="delayed")
    assert 0 < delayed - bf16 <= F.WEIGHT_CACHE_BYTES["delayed"] / 2 * bf16
