"""bench/fuzz.py's generators: junk values, mutated plan documents, corrupted JSON text, cluster specs
and documents, constraints, global batches and whole `sapp` command lines, each drawn from a
random.Random so a seed replays it (tests/test_fuzz.py drives them from hypothesis's source)."""
from __future__ import annotations

import json
import random

SMALL_MODELS = ("gpt-tiny", "mlp-tiny", "bert-tiny")


# ---- junk values ------------------------------------------------------------------------------------
ATOMS = [None, True, False, 0, 1, -1, 2, 3, 7, 8, 16, 0.0, 0.5, 1.5, -2.5, 1e-300, 1e300, 10**18, 10**30,
         2**63, "", "abc", "0", "1", "8", "true", "null", "none", "full", "1f1b", "interleaved", "layers.0",
         "a100-80g", "NaN", "inf", "\x00", "é", "x" * 300]


def junk(rng: random.Random, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.6:
        return rng.choice(ATOMS)
    if r < 0.8:
        return [junk(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "size", "blocks", "dp", "split", "", "0"]): junk(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


def _paths(x, path=()):
    yield path
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _paths(v, path + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x[:4]):          # lists of operators/stages: the first few stand for all
            yield from _paths(v, path + (i,))


def mutate(rng: random.Random, doc, n=None):
    """A copy of a JSON document with 1-3 random edits: delete, replace by junk, retype, add a key."""
    doc = json.loads(json.dumps(doc))
    for _ in range(n or rng.randint(1, 3)):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            return junk(rng)
        # operators hold most paths; pick among sections first so every section gets its share
        top = rng.choice(sorted({p[0] for p in paths}, key=str))
        path = rng.choice([p for p in paths if p[0] == top])
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        key, op = path[-1], rng.random()
        if op < 0.25 and isinstance(parent, dict):
            del parent[key]
        elif op < 0.75:
            parent[key] = junk(rng)
        elif op < 0.85:
            parent[key] = [parent[key]]
        elif op < 0.95:
            v = parent[key]
            parent[key] = (str(v) if not isinstance(v, str) else (len(v) if rng.random() < 0.5 else None))
        elif isinstance(parent, dict):
            parent[rng.choice(["bogus", "zer0", "dp"])] = junk(rng)
    return doc


def corrupt_text(rng: random.Random, text: str):
    r = rng.random()
    if r < 0.3:
        return text[:rng.randint(0, len(text))]
    if r < 0.6:
        i = rng.randrange(len(text))
        return text[:i] + rng.choice(["\x00", "}", "{", "NaN", "Infinity", "1e999", '"', ",", "\ufffd"]) + text[i + 1:]
    if r < 0.8:
        return text.replace("1", "1e999", 1) if rng.random() < 0.5 else text.replace(": 2", ": -2", 1)
    return rng.choice(["", "null", "[]", "42", '"plan"', "{}", "\x89PNG\r\n", "{" * 5000, "[" * 100000])


# ---- generators -------------------------------------------------------------------------------------
CLUSTER_KEYS = ["nodes", "gpus", "devices", "memory", "flops", "peak_flops", "intra_bw", "inter_bw", "mem_bandwidth",
                "intra_latency", "memory_headroom", "compute_efficiency", "precision", "async_launch", "op_overhead",
                "mem_bw_curve", "name", "bogus", ""]
CLUSTER_VALUES = ["1", "2", "8", "0", "-1", "1.5", "inf", "nan", "1e999", "1e18", "1000000000", "80GB", "300GB/s",
                  "5us", "200Gb/s", "true", "false", "yes", "abc", "", "bf16-mixed", "fp32", "0.99", "3e-300",
                  "12.5TB", "1KiB", "9" * 400]


def gen_cluster_spec(rng: random.Random):
    if rng.random() < 0.05:
        return rng.choice([5, None, 1.5, ["a100-80g"], b"cpu", {"nodes": 1}])
    name = rng.choice(["a100-80g", "h100-80g", "h200", "v100-32g", "cpu", "A100-80G", "tpu", "", "x.json",
                       "ok.JSON", "/nonexistent/c.json"])
    items = [f"{rng.choice(CLUSTER_KEYS)}={rng.choice(CLUSTER_VALUES)}" if rng.random() < 0.9
             else rng.choice(CLUSTER_KEYS) for _ in range(rng.randint(0, 4))]
    return name + (":" + ",".join(items) if items or rng.random() < 0.2 else "")


def gen_cluster_doc(rng: random.Random, base):
    r = rng.random()
    if r < 0.1:
        return {}
    if r < 0.2:
        return {k: v for k, v in base.items() if rng.random() < 0.5}
    return mutate(rng, base)


CONSTRAINT_KEYS = ["tp", "dp", "pp", "micro_batches", "schedule", "virtual_chunks", "recompute", "zero", "stages",
                   "placement", "max_tp", "max_dp", "mb", "v", "bogus"]


def gen_constraints(rng: random.Random):
    if rng.random() < 0.05:
        return junk(rng)
    good = {"tp": [1, 2, 4, 8], "dp": [1, 2, 4], "pp": [1, 2], "micro_batches": [1, 2, 4], "schedule":
            ["gpipe", "1f1b", "interleaved", "none"], "virtual_chunks": [1, 2, 4], "zero": [0, 1, 2, 3],
            "recompute": ["none", "selective", "full", {"layers.0": "full"}, {"layers.*": "selective"}],
            "stages": [{"layers.0": 0, "layers.1": 1}, {"layers.1": 0}], "placement": [{"*": "host"}],
            "max_tp": [1, 2], "max_dp": [2, 8]}
    out = {}
    for _ in range(rng.randint(0, 4)):
        k = rng.choice(CONSTRAINT_KEYS)
        out[k] = rng.choice(good[k]) if k in good and rng.random() < 0.7 else junk(rng)
    return out


def gen_global_batch(rng: random.Random):
    return rng.choice([None, None, 8, 16, 64, 1, 0, -8, 1.5, 8.0, "8", "abc", float("nan"), float("inf"), [16],
                       10**30, 1 << 22, (1 << 22) + 1, True, 10**12])


def gen_argv(rng: random.Random, files):
    cmd = rng.choice(["search", "evaluate", "explain", "diff", "plot", "run", "calibrate", "models", "clusters",
                      "schema", "nosuch", "--help"])
    models = list(SMALL_MODELS) + ["nosuch", "", "gpt-tiny"]
    pool = {
        "--model": models, "--cluster": ["cpu", "a100-80g:nodes=1", gen_cluster_spec(rng), files["cluster"]],
        "--batch": ["8", "0", "-1", "1e12", "abc", "1000000000000", "16"],
        "--out": [files["out"], "/nonexistent/dir/p.json", files["dir"], files["dir"] + "/x.unknownext", ""],
        "--tp": ["1", "2", "0", "x"], "--dp": ["1", "2", "-2"], "--pp": ["1", "2", "99"],
        "--zero": ["0", "3", "5"], "--micro-batches": ["1", "2", "0"], "--virtual-chunks": ["1", "2", "3"],
        "--schedule": ["1f1b", "interleaved", "bogus"], "--recompute": ["full", "x"],
        "--precision": ["fp32", "bf16-mixed", "fp8"], "--nnodes": ["0", "1", "2:1", "x", "1:2"],
        "--nproc": ["0", "1", "2", "-1"], "--model-arg": ["dropout=abc", "dropout=0", "l=2", "x", "dropout=NaN"],
        "--steps": ["0", "1"], "--width": ["100", "400", "100000"], "--height": ["300", "0"],
        "--procs": ["0", "1", "1000"], "--timeout": ["0", "-1", "nan", "5"], "--json": None, "--quick": None,
    }
    argv = [cmd]
    if cmd in ("evaluate", "explain", "plot", "run"):
        argv.append(rng.choice(files["plans"]))
    if cmd == "diff":
        argv += [rng.choice(files["plans"]), rng.choice(files["plans"])]
    if cmd == "schema":
        argv.append(rng.choice(["plan", "cluster", "nope"]))
    flags = {"search": ["--model", "--cluster", "--batch", "--out", "--tp", "--dp", "--pp", "--zero", "--micro-batches",
                        "--virtual-chunks", "--schedule", "--recompute", "--precision", "--json"],
             "evaluate": ["--model", "--cluster", "--json"], "plot": ["--out", "--width", "--height"],
             "run": ["--model", "--nnodes", "--nproc", "--model-arg", "--steps", "--out", "--timeout"],
             "calibrate": ["--out", "--procs", "--timeout", "--quick"], "models": ["--json"], "clusters": ["--json"]}
    if cmd == "search":
        argv += ["--model", rng.choice(models), "--cluster", rng.choice(pool["--cluster"])]
    if cmd == "run" and rng.random() < 0.8:
        argv += ["--model", "gpt-tiny"]
    for _ in range(rng.randint(0, 4)):
        allowed = flags.get(cmd) if rng.random() < 0.9 else None
        flag = rng.choice(allowed or list(pool))
        argv.append(flag)
        if pool[flag] is not None:
            argv.append(str(rng.choice(pool[flag])))
    if cmd == "calibrate" and "--out" not in argv and rng.random() < 0.8:
        argv += ["--out", rng.choice(pool["--out"])]
    return [str(a) for a in argv]          # a shell hands over strings only
