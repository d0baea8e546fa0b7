"""What the Megatron-Core runtime profiles overlap, by hand: the distributed optimizer's parameter
all-gather behind the next step's first forward (--overlap-param-gather, runtime "fused"), and the
tensor-parallel collectives pipelined against their linear layers' GEMMs (--tp-comm-overlap, runtime
"fused+tp-overlap", costmodel/tp_overlap.py)."""
import pytest

from sapp.cluster import Cluster
from sapp.costmodel import CostSettings
from sapp.costmodel.gradsync import DDP_BUCKET_BYTES, exposed_grad_sync
from sapp.costmodel.tp_overlap import exposed
from sapp.errors import SappError


def test_param_gather_hides_behind_the_first_forward():
    g = 4 * DDP_BUCKET_BYTES
    # ZeRO-1: 1 s of sync = 0.5 s reduce-scatter + 0.5 s all-gather (same bytes, same ring); latency 0.02
    # split alike.  Reduce-scatter under a 0.3 s backward: max(0.5 / 4 + 0.01, 0.51 - 0.3) = 0.21;
    # all-gather under a 0.1 s forward: max(0.135, 0.51 - 0.1) = 0.41.
    assert exposed_grad_sync("megatron-buckets", 1.0, 0.02, 0.3, grad_bytes=g, forward_s=0.1, zero=1) == \
        pytest.approx(0.21 + 0.41)
    # long passes: each half leaves only its first-needed 25 MB bucket (a quarter of it) and its latency
    assert exposed_grad_sync("megatron-buckets", 1.0, 0.02, 9.0, grad_bytes=g, forward_s=9.0, zero=1) == \
        pytest.approx(2 * (0.125 + 0.01))
    # ZeRO-0 all-reduces: nothing to gather, the old rule (last bucket or what backward cannot hide)
    assert exposed_grad_sync("megatron-buckets", 1.0, 0.02, 0.3, grad_bytes=g, forward_s=0.1, zero=0) == \
        pytest.approx(0.72)


def test_tp_collective_against_its_gemm_by_hand():
    # a ring of 4: the first chunk's transfer (1/4) always shows; a GEMM shorter than the transfer
    # leaves 3/4 of the difference too
    assert exposed(0.4, 1.0, 4) == pytest.approx(0.1)
    assert exposed(0.4, 0.2, 4) == pytest.approx(0.1 + 0.75 * 0.2)
    assert exposed(0.4, 0.0, 4) == pytest.approx(0.4)          # nothing to hide behind
    assert exposed(0.0, 1.0, 8) == 0.0


def test_tp_overlap_runtime_prices_a_quarter_of_the_sp_collectives_at_t4():
    """A GPT block at t=4 with sequence parallelism: every tensor-parallel collective borders a linear
    layer (all-gather before QKV and fc1, reduce-scatter after the output projection and fc2) whose
    GEMM at h=6144 outlasts it, so only the first chunk of each, 1/4, stays exposed."""
    import sapp.models as zoo
    from sapp.api import capture_graph, tp_search_fn
    from sapp.search.constraints import Constraints
    from sapp.costmodel import evaluate_sharding
    from sapp.search.joint.context import SearchContext
    g, _ = capture_graph(zoo.get("gpt3-175b", l=2, h=6144, a=48, s=2048, V=51200, attn="sdpa"))
    cl = Cluster.parse("h100-80g:nodes=1")
    out = {}
    for rt in ("fused", "fused+tp-overlap"):
        st = CostSettings(precision="bf16-mixed", runtime=rt)
        ctx = SearchContext(g, cl, 8, Constraints.from_dict({"tp": 4, "pp": 1}), st, tp_search_fn())
        prof = ctx.profile(2, 4, True)
        cost = evaluate_sharding(prof.template, prof.strategies, prof.mesh, cl, st)
        block = next(b for b in cost.per_block)
        out[rt] = cost.per_block[block]["reshard_s"]
    assert out["fused"] > 0
    assert out["fused+tp-overlap"] == pytest.approx(out["fused"] / 4, rel=1e-9)


def test_runtime_name_is_checked():
    with pytest.raises(SappError, match="fused\\+tp-overlap"):
        CostSettings(runtime="megatron")
