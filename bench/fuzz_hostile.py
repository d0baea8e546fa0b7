"""The hostile input classes of `python -m bench.fuzz` (issue 27): deep nesting, huge counts, tiny and
huge floats, special files as paths, and plans a schema admits that name what the model lacks.  Each
generator returns the input and what must happen to it: "refuse" (a one-line SappError; success
means sapp scored something it had to refuse: counted as nonsense) or "any" (success or a SappError;
a success must still make sense: `check_sane`)."""
from __future__ import annotations

import json
import math
import os
import socket

EXTREME_FLOATS = [5e-324, 1e-300, 1e-30, 1e-12, 0.0, 1e12, 1e30, 1e300, 1.7e308]
CLUSTER_FLOAT_KEYS = ["peak_flops", "intra_latency", "inter_latency", "compute_scale", "mem_bandwidth", "intra_bw",
                      "inter_bw", "device_memory", "op_overhead", "rng_rate", "host_flops", "h2d_bw", "host_memory",
                      "host_mem_bandwidth", "fsdp_unit_overhead", "update_op_overhead", "sharded_op_overhead"]
HUGE_COUNTS = [1 << 20, 1 << 22, (1 << 22) + 1, 1 << 30, 1 << 40]
DEPTHS = [31, 33, 100, 900, 5000]
LENGTHS = [4097, 100_000, 1 << 20]


class Nonsense(Exception):
    """A result sapp should never give: NaN or non-positive step, MFU over 100%, ignored pins or names."""


def check_sane(step_s, mfu, what="evaluate"):
    if not (isinstance(step_s, (int, float)) and math.isfinite(step_s) and step_s > 0):
        raise Nonsense(f"{what} predicted step {step_s!r}")
    if not (math.isfinite(mfu) and 0 <= mfu <= 1 + 1e-9):
        raise Nonsense(f"{what} predicted MFU {mfu!r}")


def check_plan(plan, constraints=None):
    """A searched plan: sane figures, and the host pins kept (context parallelism runs none)."""
    pr = plan["predicted"]
    check_sane(pr["step_time_s"], pr["mfu"], "search")
    pins = (constraints or {}).get("placement") if isinstance(constraints, dict) else None
    if isinstance(pins, dict) and "host" in pins.values() and plan["parallel"].get("cp", 1) > 1:
        raise Nonsense(f"search dropped host placement pins {pins} for cp={plan['parallel']['cp']}")


def nested(rng, depth, leaf=1):
    x = leaf
    for _ in range(depth):
        x = {"a": x} if rng.random() < 0.5 else [x]
    return x


def deep_text(rng):
    n = rng.choice(DEPTHS + [100_000])
    if rng.random() < 0.5:
        return "[" * n + "]" * n
    return '{"a":' * n + "1" + "}" * n


def _at(doc, rng):
    """A random dict inside doc to plant something in (model, model.meta, cluster, placement...)."""
    spots = [doc["model"], doc["model"].setdefault("meta", {}), doc["placement"], doc["pipeline"], doc]
    return rng.choice(spots)


def hostile_plan(rng, seed):
    """(document, expectation) from a valid plan `seed`."""
    doc = json.loads(json.dumps(seed))
    kind = rng.choice(["deep", "long", "float", "count", "ghost", "ghost", "cp-host"])
    if kind == "deep":
        depth = rng.choice(DEPTHS)
        _at(doc, rng)["zz_deep" if rng.random() < 0.5 else "meta"] = nested(rng, depth)
        return doc, ("refuse" if depth >= 33 else "any")
    if kind == "long":
        n = rng.choice(LENGTHS)
        where = rng.choice(["model.name", "cluster.name", "notes", "op-key", "meta-key"])
        if where == "model.name":
            doc["model"]["name"] = "m" * n
        elif where == "cluster.name":
            doc["cluster"]["name"] = "c" * n
        elif where == "notes":
            doc["notes"] = ["n" * n]
        elif where == "op-key":
            doc["operators"]["o" * n] = next(iter(doc["operators"].values()))
        else:
            doc["model"].setdefault("meta", {})["k" * n] = 1
        return doc, "refuse"
    if kind == "float":
        for _ in range(rng.randint(1, 3)):
            doc["cluster"][rng.choice(CLUSTER_FLOAT_KEYS)] = rng.choice(EXTREME_FLOATS)
        return doc, "any"
    if kind == "count":
        m = rng.choice(HUGE_COUNTS)
        pipe = doc["pipeline"]
        pipe["micro_batches"] = m
        pipe["micro_batch_size"] = 1
        doc["model"]["global_batch"] = m * doc["parallel"]["dp"] * (1 if rng.random() < 0.8 else 2)
        if rng.random() < 0.3:
            pipe["virtual_chunks"] = rng.choice([2, 3, 1024])
        return doc, "any"
    if kind == "cp-host":
        doc["parallel"]["cp"] = 2
        doc["parallel"]["dp"] = max(1, doc["parallel"]["dp"] // 2)
        doc["placement"]["groups"]["*"] = {"weights": "device", "grads": "host", "master_weights": "host",
                                           "optimizer": "host", "optimizer_kind": "adam"}
        return doc, "refuse"       # (the product no longer matches the devices where dp was 1)
    ghost = "ghost" + str(rng.randrange(100))
    where = rng.choice(["stage", "tp", "placement", "recompute", "operator", "split"])
    stages = doc["pipeline"].get("stages") or []
    if where == "stage" and stages:
        rng.choice(stages).setdefault("blocks", []).append(f"layers.{ghost}")
    elif where == "split" and stages:
        rng.choice(stages)["split_before"] = f"layers.{ghost}"
    elif where == "tp":
        doc["tp_modules"] = dict(doc.get("tp_modules") or {}, **{f"layers.0.{ghost}": rng.choice(["colwise", "rowwise"])})
    elif where == "placement":
        doc["placement"]["groups"][f"{ghost}.weight"] = {"weights": "device", "optimizer": "host"}
    elif where == "recompute":
        doc["recompute"]["blocks"] = dict(doc["recompute"].get("blocks") or {}, **{f"layers.{ghost}": "full"})
    else:
        doc["operators"][ghost] = next(iter(doc["operators"].values()))
    return doc, "refuse"


def hostile_cluster(rng, base):
    """A cluster dict or spec with tiny / huge figures (the schema's number type admits them all)."""
    if rng.random() < 0.5:
        d = dict(base)
        for _ in range(rng.randint(1, 3)):
            d[rng.choice(CLUSTER_FLOAT_KEYS)] = rng.choice(EXTREME_FLOATS)
        return "dict", d
    items = ",".join(f"{rng.choice(CLUSTER_FLOAT_KEYS)}={rng.choice(EXTREME_FLOATS)!r}" for _ in range(rng.randint(1, 3)))
    return "spec", rng.choice(["a100-80g:nodes=1,", "cpu:"]) + items


def hostile_constraints(rng):
    """Huge counts and pins that cannot hold together (host pins beside cp)."""
    c = {}
    r = rng.random()
    if r < 0.4:
        c["micro_batches"] = rng.choice(HUGE_COUNTS)
        c["schedule"] = rng.choice(["interleaved", "1f1b", "gpipe"])
        c["pp"] = rng.choice([2, None])
    elif r < 0.7:
        c["placement"] = {"optimizer": "host"}
        c["cp"] = rng.choice([None, 2])
        c["tp"], c["pp"] = rng.choice([(1, 1), (None, None)])
    else:
        c["virtual_chunks"] = rng.choice([2, 1024, 1 << 20])
        c["schedule"] = "interleaved"
        c["micro_batches"] = rng.choice(HUGE_COUNTS)
    return {k: v for k, v in c.items() if v is not None}


def special_paths(tmp):
    """Paths that are no regular file: a FIFO (also named .json), a socket, devices, a folder, a
    symlink to the FIFO.  Created once per run."""
    out = ["/dev/zero", "/dev/null", "/dev/stdin", tmp]
    for name in ("fifo.json", "fifo"):
        p = os.path.join(tmp, name)
        if not os.path.exists(p):
            os.mkfifo(p)
        out.append(p)
    link = os.path.join(tmp, "link-to-fifo.json")
    if not os.path.lexists(link):
        os.symlink(os.path.join(tmp, "fifo.json"), link)
    out.append(link)
    sock = os.path.join(tmp, "sock.json")
    if not os.path.exists(sock):
        s = socket.socket(socket.AF_UNIX)
        s.bind(sock)
        s.close()
    out.append(sock)
    return out


def special_path_call(rng, paths, files):
    """(description, callable) reading or writing a special path through one entry point."""
    from sapp.cluster import Cluster
    from sapp.plan import Plan
    p = rng.choice(paths)
    which = rng.choice(["plan", "cluster", "cli-plan", "cli-cluster", "cli-out", "plot-out"])
    if which == "plan":
        return (which, p), lambda: Plan.load(p)
    if which == "cluster":
        return (which, p), lambda: Cluster.load(p)
    if which == "cli-plan":
        return (which, p), ["cli", [rng.choice(["evaluate", "explain", "plot", "run"]), p, "--model", "gpt-tiny"]]
    if which == "cli-cluster":
        return (which, p), ["cli", ["search", "--model", "gpt-tiny", "--cluster", p]]
    if which == "cli-out":
        return (which, p), ["cli", ["search", "--model", "gpt-tiny", "--cluster", "cpu", "--out", p]]
    return (which, p), ["cli", ["plot", files["plans"][0], "--out", p if p.endswith((".png", ".svg")) else p]]
