"""Issue 29's 1T anomaly (SP + selective recomputation priced about as slow as full recomputation) on a
small analogue: 16 layers of the 1T GPT's width (h=25600, a=160, s=2048, V=51200) at t=8, p=8, with
the device memory lowered so that stage 0 binds as it does at p=64 (in flight: p micro-batches).

The cause: under sequence parallelism the token table stayed whole on every tp rank (the sharding
search weighs time only, and an unsplit lookup is cheaper), so its weights, gradients and Adam states
(16 bytes x 1.31B parameters = 21 GB) sat on stage 0 beside two blocks' states and 2p micro-batches
of selective activations.  Stage 0 then held one block fewer, another stage a third one, and that
stage set the step.  Megatron's SP runs the table split by vocabulary with its partial sums reduce-
scattered into the sequence shards (sp_layout.vocab_split; sapp/emit/tp/sp.py emits it)."""
import pytest

from sapp import models, search
from sapp.api import capture_graph, resolve_model
from sapp.cluster import Cluster
from sapp.costmodel import CostSettings
from sapp.pipeline.profile import build_profile
from sapp.search import tp_layout

H, A, S, V, TP = 25600, 160, 2048, 51200, 8


@pytest.fixture(scope="module")
def gpt16():
    module, _, _ = resolve_model(models.get("gpt-tiny", l=16, h=H, a=A, s=S, V=V, ffn=4 * H, attn="eager"))
    return capture_graph(module)[0]


def test_sp_splits_the_token_table_by_vocabulary(gpt16):
    cl = Cluster.parse("a100-80g:nodes=1")
    st = CostSettings(precision=cl.precision, runtime="fused")
    prof = build_profile(gpt16, cl, st, 1, TP, sp=True, zeros=(0,), search_fn=tp_layout.search_fn)
    pro = next(u for u in prof.units if u.name == "prologue")
    # hand count: the token table V x h split 8 ways, the position table s x h whole
    assert pro.states[0]["params"] == pytest.approx((V * H / TP + S * H) * st.weight_bytes, rel=1e-6)
    assert pro.states[0]["optimizer"] == pytest.approx((V * H / TP + S * H) * st.optimizer_bytes, rel=1e-6)
    tok = next(n for n, node in prof.template.nodes.items() if node.module == "embed.tok")
    pos = next(n for n, node in prof.template.nodes.items() if node.module == "embed.pos")
    assert prof.strategies[tok] == ("v",) and prof.strategies[pos] == (None,)


def test_sp_selective_faster_than_full_by_the_recomputed_forward(gpt16):
    cluster = "a100-80g:nodes=8,device_memory=50e9"
    plans = {rc: search("gpt-tiny", cluster, global_batch=64, graph=gpt16, runtime="fused",
                        constraints=dict(tp=TP, pp=8, recompute=rc, sp=True, schedule="1f1b", micro_batches=64))
             for rc in ("selective", "full")}
    for rc, plan in plans.items():
        assert plan["parallel"]["sp"] and plan["tp_modules"]["embed.tok"] == "vocab"
        # 16 blocks on 8 stages: two each (before the fix selective did not fit at all here, and full
        # recomputation put one block on stage 0 and three on stage 6)
        assert [len(s["blocks"]) for s in plan["pipeline"]["stages"]] == [2] * 8, rc
    sel, full = (plans[rc]["predicted"]["step_time_s"] for rc in ("selective", "full"))
    # hand count: a block's GEMMs are 3 forwards' worth with selective recomputation (forward + a
    # backward of two) and 4 with full (one more forward); the attention core selective recomputes is
    # 5as/h of the activations but a sliver of the FLOPs, so the step falls by about a quarter
    assert 0.70 < sel / full < 0.82
