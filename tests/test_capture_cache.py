"""The capture cache (sapp/capture/cache.py): a warm search reads the graph back and makes the same
plan, byte for byte; a corrupt entry is ignored and rewritten; the key follows the model's config and
the capture code; a warm `sapp search` imports neither torch._dynamo nor torch."""
import json
import os
import subprocess
import sys

import pytest

from sapp import api
from sapp.capture import cache, graph_json
from sapp.commands.cli import main

CLUSTER = "a100-80g:nodes=1"
HF = os.path.join(os.path.dirname(__file__), "data", "llama.json")


def entries(folder):
    return sorted(p for p in os.listdir(folder) if p.endswith(".json")) if folder.exists() else []


@pytest.mark.parametrize("spec", ["gpt-tiny", "moe-tiny", "wide-deep-tiny", HF])
def test_graph_json_round_trip_is_exact(spec):
    module, _, _ = api.resolve_model(spec)
    g, _ = api.capture_graph(module)
    back = graph_json.from_data(json.loads(json.dumps(graph_json.to_data(g))))
    assert back == g                         # every node, operand, dim, param, block and meta value, types too
    assert back.fingerprint() == g.fingerprint()


@pytest.mark.parametrize("spec", ["gpt-tiny", HF])
def test_plan_is_byte_identical_with_and_without_cache(spec, cache_dir):
    fresh = api.search(spec, CLUSTER, cache=False)
    cold = api.search(spec, CLUSTER, cache=True)         # captures, stores
    assert not cold._timing.get("capture_cached") and len(entries(cache_dir)) == 1
    warm = api.search(spec, CLUSTER, cache=True)         # reads back
    assert warm._timing.get("capture_cached")
    assert fresh.to_json() == cold.to_json() == warm.to_json()
    # one entry serves every precision: capture does not depend on it, the cost model applies it
    assert api.search(spec, CLUSTER, cache=True, precision="fp32").to_json() == \
        api.search(spec, CLUSTER, cache=False, precision="fp32").to_json()


def test_corrupt_entry_is_ignored_and_rewritten(cache_dir):
    api.search("gpt-tiny", CLUSTER, cache=True)
    (name,) = entries(cache_dir)
    path = cache_dir / name
    good = path.read_bytes()
    key = name[:-len(".json")]
    assert cache.load(key) is not None
    head, body = good.split(b"\n", 1)
    i = body.index(b'"linear"') if b'"linear"' in body else len(body) // 2
    bad_variants = [b"", b"not json\n{}", head + b"\n" + body[:-10],            # empty, garbage, truncated
                    head + b"\n" + body[:i] + b"X" + body[i + 1:],             # a byte changed: checksum
                    head.replace(key.encode(), b"0" * len(key)) + b"\n" + body]  # another key's header
    for bad in bad_variants:
        path.write_bytes(bad)
        assert cache.load(key) is None
    plan = api.search("gpt-tiny", CLUSTER, cache=True)
    assert not plan._timing.get("capture_cached")       # captured again ...
    assert path.read_bytes() == good and cache.load(key) is not None   # ... and the entry rewritten


def test_key_follows_config_and_code(tmp_path, monkeypatch):
    import sapp.models as zoo
    base = cache.key_for("gpt-tiny", 8)
    assert base and base == cache.key_for("gpt-tiny", 8)
    assert base != cache.key_for("gpt-small", 8) and base != cache.key_for("gpt-tiny", 16)
    kind, cfg = zoo.NAMED["gpt-tiny"]
    monkeypatch.setitem(zoo.NAMED, "gpt-tiny", (kind, dict(cfg, ffn=cfg["ffn"] * 2)))
    assert cache.key_for("gpt-tiny", 8) != base                  # the zoo config changed
    monkeypatch.setitem(zoo.NAMED, "gpt-tiny", (kind, cfg))
    monkeypatch.setattr(cache, "_SOURCES", "another capture code")
    assert cache.key_for("gpt-tiny", 8) != base                  # the capture / model code changed
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    d = json.loads(open(HF).read())
    a.write_text(json.dumps(d))
    b.write_text(json.dumps(dict(d, num_hidden_layers=d["num_hidden_layers"] + 1)))
    ka, kb = cache.key_for(str(a), 8), cache.key_for(str(b), 8)
    assert ka and kb and ka != kb
    b.write_text(json.dumps(d))
    assert cache.key_for(str(b), 8) != ka                        # the spec (a path) is in the graph's name
    c = tmp_path / "c.json"
    c.write_text(json.dumps(dict(d, auto_map={"AutoModelForCausalLM": "m.M"})))
    assert cache.key_for(str(c), 8) is None                      # names code: never cached
    assert cache.key_for("mypkg.mod:build", 8) is None           # a factory is code
    assert cache.key_for("no-such-model", 8) is None


def test_cache_off_and_no_cache_flag(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SAPP_CACHE_DIR", "")
    assert cache.directory() is None and not cache.store("k", None, None) and cache.load("k") is None
    monkeypatch.setenv("SAPP_CACHE_DIR", str(tmp_path))
    assert main(["search", "--model", "gpt-tiny", "--cluster", CLUSTER, "--no-cache"]) == 0
    assert not (tmp_path / "capture").exists()
    assert main(["search", "--model", "gpt-tiny", "--cluster", CLUSTER]) == 0
    assert main(["search", "--model", "gpt-tiny", "--cluster", CLUSTER]) == 0
    assert "(cached)" in capsys.readouterr().out and len(entries(tmp_path / "capture")) == 1


def test_size_is_bounded(cache_dir, monkeypatch):
    module, _, _ = api.resolve_model("gpt-tiny")
    g, _ = api.capture_graph(module)
    monkeypatch.setattr(cache, "MAX_ENTRIES", 2)
    for i, k in enumerate(("k1", "k2", "k3")):
        assert cache.store(k, g, None)
        os.utime(cache_dir / f"{k}.json", (1000 + i, 1000 + i))     # distinct ages, oldest first
    assert entries(cache_dir) == ["k2.json", "k3.json"]
    monkeypatch.setattr(cache, "MAX_ENTRIES", 64)
    monkeypatch.setattr(cache, "MAX_BYTES", os.path.getsize(cache_dir / "k3.json") + 1)
    assert cache.store("k4", g, None) and entries(cache_dir) == ["k4.json"]


WARM = """
import sys
from sapp.commands.cli import main
assert main(["search", "--model", "gpt-tiny", "--cluster", "a100-80g:nodes=1", "--out", sys.argv[1], "--full"]) == 0
print("MODULES", "torch._dynamo" in sys.modules, "torch" in sys.modules)
"""


def test_warm_search_imports_no_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("SAPP_CACHE_DIR", str(tmp_path / "c"))
    assert main(["search", "--model", "gpt-tiny", "--cluster", CLUSTER, "--out", str(tmp_path / "cold.json"), "--full"]) == 0
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", WARM, str(tmp_path / "warm.json")], env=env, cwd=os.getcwd(),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    # warm: the graph read back (no torch._dynamo, no torch at all: the search is pure Python)
    assert out.stdout.split("MODULES")[-1].split() == ["False", "False"]
    assert (tmp_path / "cold.json").read_bytes() == (tmp_path / "warm.json").read_bytes()
