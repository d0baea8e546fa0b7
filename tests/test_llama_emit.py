"""The zoo's llama-tiny (RMSNorm, rotary, GQA with 2 KV heads for 4 query heads, SwiGLU, untied head,
SDPA attention) and the SDPA GPT, planned by sapp's own search with the degrees pinned and run on gloo:
each run's losses equal single-process training within 1e-5 relative over 3 Adam steps.

One spawned 2-rank job: llama dp2, llama tp2 (the searched layout: wq / wk / wv column-split on whole
heads, wo row-split; with kv=2 each rank holds one whole KV head and its two query heads), llama pp2
(1F1B), and the SDPA GPT tp2."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.emit_workers.hf_plans import CONFIGS, TP_CLUSTER  # noqa: E402
from tests.emit_workers import joblock  # noqa: E402

REL_TOL = 1e-5
STEPS = 3
BATCH = 8
CASES = [("llama", "llama-tiny", {}, "dp2"), ("llama", "llama-tiny", {}, "tp2"), ("llama", "llama-tiny", {}, "pp2"),
         ("gpt-sdpa", "gpt-tiny", {"dropout": 0.0, "attn": "sdpa"}, "tp2")]


def _plan(name, overrides, config, path):
    import sapp.models as zoo
    from sapp.api import search
    from tests.emit_workers import zoo as tz
    cons = dict(CONFIGS[config], zero=0)
    n = cons["dp"] * cons["tp"] * cons["pp"]
    cluster = TP_CLUSTER.format(n=n) if cons["tp"] > 1 else f"cpu:gpus={n}"
    kind = [k for k, (nm, ov) in tz.TINY.items() if nm == name and ov == overrides][0]
    x, y = tz.batch(kind, BATCH, 0)
    m = zoo.get(name, **overrides)
    plan = search(m, cluster, global_batch=BATCH, example_inputs=x, constraints=cons, loss_fn=zoo.loss_fn(m),
                  targets=y)
    plan.save(path)
    return str(path)


# about 37 s of gloo jobs: `pytest -m slow`.  Third-party Llama (HF) runs the same layouts in the suite
# (tests/test_hf_emit.py, tests/test_cp_emit.py); whole kv heads under tp: tests/test_tp_layout.py
pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llama")
    cases = []
    for kind, name, ov, config in CASES:
        cid = f"{kind}-{config}"
        cases.append({"id": cid, "kind": kind, "plan_path": _plan(name, ov, config, tmp / f"{cid}.json"),
                      "steps": STEPS, "batch": BATCH})
    cpath, opath = tmp / "cases.json", tmp / "out.json"
    cpath.write_text(json.dumps(cases))
    # hard timeout: a hung collective must fail the test, not the CI run
    proc = joblock.run([sys.executable, "-m", "tests.emit_workers.harness", "2", str(cpath), str(opath)],
                       cwd=ROOT, capture_output=True, text=True, timeout=500)
    assert opath.exists(), proc.stderr[-3000:]
    out = json.loads(opath.read_text())
    assert not out["errors"], "\n".join(out["errors"].values())[-3000:]
    return out["cases"], {c["id"]: json.loads(open(c["plan_path"]).read()) for c in cases}


@pytest.mark.parametrize("cid", [f"{k}-{c}" for k, _, _, c in CASES])
def test_llama_and_sdpa_plans_match_single_process(job, cid):
    res = job[0][cid]
    ref = res["ref"]
    assert ref[-1] != ref[0]
    for r in range(2):
        got = res["ranks"][str(r)]
        assert got is not None and "error" not in got, got
        for i, (a, b) in enumerate(zip(got["losses"], ref)):
            assert abs(a - b) <= REL_TOL * abs(b), f"{cid} rank {r} step {i}: {a} vs single-process {b}"


def test_gqa_tp_layout_holds_whole_kv_heads(job):
    _, plans = job
    p = plans["llama-tp2"]
    tm = p["tp_modules"]
    for m in ("wq", "wk", "wv"):
        assert tm[f"layers.0.attn.{m}"] == "colwise", tm
    assert tm["layers.0.attn.wo"] == "rowwise"
    assert tm["layers.0.mlp.w1"] == "colwise" and tm["layers.0.mlp.w3"] == "colwise" and tm["layers.0.mlp.w2"] == "rowwise"
    # the sdpa operator splits its head dim, and tp=2 divides the 2 KV heads: one whole KV head per rank
    sd = [o for o in p["operators"].values() if o["kind"] == "attention"]
    assert sd and all("b1" in o["split"] for o in sd)
    assert p["pipeline"]["stages"] and p["parallel"]["tp"] == 2
    gp = plans["gpt-sdpa-tp2"]["tp_modules"]
    assert gp["layers.0.attn.qkv"] == "colwise" and gp["layers.0.attn.proj"] == "rowwise"
