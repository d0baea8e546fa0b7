"""The capture cache cannot answer for another model: an HF config rewritten mid-search stores the
graph of the bytes that were hashed, an entry whose payload was re-signed with other FLOPs is a miss,
and `sapp run`'s model check refuses a plan priced from other FLOPs even when the cache was fooled."""
import hashlib
import json
import os

import pytest

from sapp import api
from sapp.capture import cache
from sapp.errors import PlanError

CLUSTER = "a100-80g:nodes=1"
HF = os.path.join(os.path.dirname(__file__), "data", "llama.json")


def test_config_rewritten_mid_search_caches_the_hashed_bytes(tmp_path, cache_dir, monkeypatch):
    small = json.loads(open(HF).read())
    big = dict(small, num_hidden_layers=small["num_hidden_layers"] + 3, hidden_size=small["hidden_size"] * 2)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(small))
    monkeypatch.setenv("SAPP_CACHE_DIR", "")
    want = api.capture_spec(str(cfg))[3].param_count()          # the small config, uncached
    monkeypatch.setenv("SAPP_CACHE_DIR", str(cache_dir.parent))

    real = api.resolve_model

    def rewritten_meanwhile(spec, raw=None, model_args=None):
        cfg.write_text(json.dumps(big))          # another process rewrites the file after the key was hashed
        return real(spec, raw, model_args)
    monkeypatch.setattr(api, "resolve_model", rewritten_meanwhile)
    module, _, _, graph, _ = api.capture_spec(str(cfg))
    monkeypatch.setattr(api, "resolve_model", real)
    assert module is not None and graph.param_count() == want    # built from the bytes it hashed
    cfg.write_text(json.dumps(small))            # the small config again: its key, its graph
    module, _, _, graph, _ = api.capture_spec(str(cfg))
    assert module is None and graph.param_count() == want        # a hit, and the right model's


def _resign(path, body):
    head = json.loads(path.read_bytes().split(b"\n", 1)[0])
    head.update(bytes=len(body), sha256=hashlib.sha256(body).hexdigest())
    path.write_bytes(json.dumps(head).encode() + b"\n" + body)


def test_entry_re_signed_with_other_flops_is_a_miss(cache_dir):
    plan = api.search("gpt-tiny", CLUSTER, cache=True)
    (name,) = [p for p in os.listdir(cache_dir) if p.endswith(".json")]
    path, key = cache_dir / name, name[:-len(".json")]
    head, body = path.read_bytes().split(b"\n", 1)
    d = json.loads(body)
    rows = d["graph"]["nodes"]                       # positional rows: flops is field 6 (graph_json)
    for row in rows:
        row[6] = row[6] * 1000
    _resign(path, json.dumps(d, separators=(",", ":")).encode())
    assert cache.load(key) is None                   # checksum fine, but not the graph the header vouches for
    again = api.search("gpt-tiny", CLUSTER, cache=True)
    assert not again._timing.get("capture_cached") and again.to_json() == plan.to_json()


def test_run_check_refuses_a_plan_priced_from_other_flops():
    import sapp.models as models
    from sapp.emit.checks import plan as checks
    from sapp.plan import Plan
    plan = api.search("gpt-tiny", "cpu:gpus=1", global_batch=4)
    model = models.get("gpt-tiny", device="meta")
    assert plan["model"]["flops_per_sample"] > 0
    checks.check_model(model, plan, "gpt-tiny")      # the honest plan passes
    d = json.loads(plan.to_json())
    d["model"]["flops_per_sample"] *= 1000           # what a fooled cache would have priced
    with pytest.raises(PlanError, match="FLOPs per sample"):
        checks.check_model(model, Plan(d), "gpt-tiny")
    del d["model"]["flops_per_sample"]               # plans from before the field: structure alone
    checks.check_model(model, Plan(d), "gpt-tiny")
