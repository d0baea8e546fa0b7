"""Captured graphs kept on disk, so searching one model against many clusters captures it once.

Capture does not depend on the cluster: `sapp search --model gpt3-175b --cluster ...` spends its
first seconds importing torch._dynamo, building the model on meta and tracing it, the same for every
cluster.  A warm run reads the graph back instead (and imports no torch at all: the search is pure
Python).  Only models whose identity is data are cached:
  - a zoo name (its config from sapp/models/registry.py), and
  - a Hugging Face config.json (the file's bytes and the installed transformers version; not one with
    `auto_map`, which names code of its own);
a `pkg.module:factory` is code sapp cannot hash, so it is captured every time.

An entry's key hashes everything that decides the graph: the spec and its config, the capture
batch, torch's default dtype, the sapp, torch and Python versions, and the source of
sapp/capture/*.py, sapp/models/*.py and sapp/capture/ir.py (a code change invalidates every entry).  The
training precision is not in it: the graph is captured in the model's own dtypes and the cost model
applies the precision afterwards, so one entry serves every precision and runtime.  Files are
data: one JSON header line (format, key, payload size and SHA-256) and the JSON payload
(sapp/capture/graph_json.py); an entry whose header, checksum or contents do not match is ignored and
overwritten, never trusted; the header also carries the graph's fingerprint, parameter count and
FLOPs per sample, recomputed from the decoded graph on load.  An HF config is read once: the key is
hashed from those bytes and the model built from them.  The last word is `sapp run`'s: it captures the
real model and refuses a plan whose fingerprint, parameters or FLOPs differ.  Written atomically (a temporary file renamed over the entry), at most
MAX_ENTRIES entries and MAX_BYTES in all (least recently used go first).

Where: $SAPP_CACHE_DIR/capture, else $XDG_CACHE_HOME/sapp/capture, else ~/.cache/sapp/capture;
`SAPP_CACHE_DIR=` (set, empty) turns the cache off, as `sapp search --no-cache` does for one run.
Torch-free: importing this module (or a warm search) never imports torch."""
from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
import tempfile
import time

from . import graph_json

MAX_ENTRIES = 64
MAX_BYTES = 512 << 20
MAX_ENTRY_BYTES = 256 << 20      # a bigger file is not an entry this code wrote
HEADER = "sapp-capture-cache"


def directory() -> str | None:
    """The cache folder, or None when SAPP_CACHE_DIR is set and empty (cache off)."""
    env = os.environ.get("SAPP_CACHE_DIR")
    if env is not None:
        return os.path.join(os.path.expanduser(env), "capture") if env.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sapp", "capture")


_SOURCES = None


def sources_hash() -> str:
    """SHA-256 over the capture (the IR among them) and model sources (names and bytes), once per process."""
    global _SOURCES
    if _SOURCES is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        files = sorted(glob.glob(os.path.join(root, "capture", "*.py")) + glob.glob(os.path.join(root, "models", "*.py")))
        h = hashlib.sha256()
        for f in files:
            with open(f, "rb") as fh:
                data = fh.read()
            h.update(f"{os.path.relpath(f, root)}\0{len(data)}\0".encode())
            h.update(data)
        _SOURCES = h.hexdigest()
    return _SOURCES


def _version(dist) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _default_dtype() -> str:
    torch = sys.modules.get("torch")          # not imported: nothing can have changed it
    return str(torch.get_default_dtype()) if torch is not None else "torch.float32"


def read_config(spec: str) -> bytes | None:
    """The bytes of the HF config `spec` names, read once: the key is hashed from them and the model
    built from them (sapp.models.hf.build(raw=...)), so a file rewritten mid-search cannot store one
    config's graph under another's key.  None when unreadable (the uncached way reports why)."""
    from ..fileio import read_regular
    try:
        return read_regular(spec, 64 << 20)
    except (OSError, ValueError):
        return None


def model_facts(spec: str, raw: bytes | None = None) -> dict | None:
    """What identifies the model `spec` names, or None when it cannot be hashed reliably (a factory,
    an unknown zoo name, an unreadable or code-naming HF config: those go the uncached way, which
    also reports their errors).  `raw`: the HF config's bytes as read_config gave them."""
    from ..models.resolve import kind_of
    kind = kind_of(spec)
    if kind == "zoo":
        import importlib
        zoo = importlib.import_module("sapp.models.zoo")
        if spec not in zoo.NAMED:
            return None
        zkind, cfg = zoo._config(spec, {})
        return {"spec": spec, "zoo": zkind, "config": graph_json._enc(cfg)}
    if kind == "hf":
        raw = read_config(spec) if raw is None else raw
        if raw is None:
            return None
        try:
            cfg = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(cfg, dict) or "auto_map" in cfg or _version("transformers") is None:
            return None
        return {"spec": spec, "hf_config_sha256": hashlib.sha256(raw).hexdigest(),
                "transformers": _version("transformers")}
    return None


def key_for(spec: str, batch: int, raw: bytes | None = None, model_args: dict | None = None) -> str | None:
    """The entry key of `spec` captured at `batch`, or None (not cacheable); `raw` as model_facts;
    `model_args`: the settings it is built with (none: the key of the spec's own)."""
    if not isinstance(spec, str):
        return None
    facts = model_facts(spec, raw)
    if facts is None:
        return None
    if model_args:
        facts["args"] = graph_json._enc(dict(sorted(model_args.items())))
    from ..version import __version__
    facts.update({"batch": batch, "default_dtype": _default_dtype(), "sapp": __version__,
                  "torch": _version("torch"), "python": list(sys.version_info[:2]),
                  "sources": sources_hash(), "format": graph_json.FORMAT})
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def graph_facts(graph) -> dict:
    """What a stored graph is checked against on load: its structure fingerprint, trainable
    parameters and forward FLOPs per sample (the figures a plan records and `sapp run` re-checks)."""
    return {"fingerprint": graph.fingerprint(), "params": graph.param_count(),
            "flops_per_sample": float(f"{graph.flops_per_sample():.9g}")}


def _path(folder, key):
    return os.path.join(folder, f"{key}.json")


def load(key: str):
    """(graph, info) stored under `key`, or None: missing, unreadable, corrupt or another key's."""
    folder = directory()
    if folder is None or not key:
        return None
    path = _path(folder, key)
    try:
        from ..fileio import read_regular
        raw = read_regular(path, MAX_ENTRY_BYTES)
        head, _, body = raw.partition(b"\n")
        h = json.loads(head)
        if (not isinstance(h, dict) or h.get("kind") != HEADER or h.get("key") != key
                or h.get("format") != graph_json.FORMAT or h.get("bytes") != len(body)
                or h.get("sha256") != hashlib.sha256(body).hexdigest()):
            return None
        d = json.loads(body)
        graph = graph_json.from_data(d["graph"])
        info = graph_json._dec(d["info"])
        if info is not None and not isinstance(info, dict):
            return None
        if h.get("graph") != graph_facts(graph):     # the payload is not the graph the header vouches for
            return None
    except Exception:          # noqa: BLE001 - any bad entry is a miss; the capture that follows rewrites it
        return None
    try:
        os.utime(path)         # recently used: kept longest
    except OSError:
        pass
    return graph, info


def store(key: str, graph, info) -> bool:
    """Write the entry atomically; False (and nothing written) when the cache is off, the graph holds
    a value JSON cannot carry, or the folder is not writable.  Never raises: the cache only saves time."""
    folder = directory()
    if folder is None or not key:
        return False
    try:
        body = json.dumps({"graph": graph_json.to_data(graph), "info": graph_json._enc(info)},
                          separators=(",", ":")).encode()
    except (graph_json.Unstorable, ValueError, TypeError):
        return False
    head = json.dumps({"kind": HEADER, "format": graph_json.FORMAT, "key": key, "bytes": len(body),
                       "sha256": hashlib.sha256(body).hexdigest(), "graph": graph_facts(graph)}).encode()
    if len(body) + len(head) + 1 > MAX_ENTRY_BYTES:
        return False
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "wb") as f:
            f.write(head + b"\n" + body)
        os.replace(tmp, _path(folder, key))
        tmp = None
        _bound(folder, keep=_path(folder, key))
        return True
    except OSError:
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _bound(folder, keep):
    """At most MAX_ENTRIES entries and MAX_BYTES: the least recently used go (never `keep`); a
    temporary file older than an hour is a writer that died."""
    now, entries = time.time(), []
    for name in os.listdir(folder):
        p = os.path.join(folder, name)
        try:
            st = os.stat(p)
        except OSError:
            continue
        if name.startswith(".tmp-"):
            if now - st.st_mtime > 3600:
                _unlink(p)
        elif name.endswith(".json"):
            entries.append((st.st_mtime, st.st_size, p))
    entries.sort(reverse=True)                 # newest first
    total = 0
    for i, (_, size, p) in enumerate(entries):
        total += size
        if p != keep and (i >= MAX_ENTRIES or total > MAX_BYTES):
            _unlink(p)


def _unlink(p):
    try:
        os.unlink(p)
    except OSError:
        pass
