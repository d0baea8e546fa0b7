"""A toy engine for tests/test_engine_table.py: data parallelism only, its file `key=value` lines.  It
is what a new engine brings (sapp/search/targets.py's module interface) and nothing more."""
from sapp.engines.mapping import EngineConfig, EngineError


def conform(cfg, names):
    """The toy runs its data-parallel ranks and nothing else: anything more is refused."""
    if cfg.tp * cfg.pp * cfg.cp * cfg.ep != 1:
        raise EngineError("the toy engine runs data parallelism only")
    return cfg, []


def export(cfg, facts, names, header=()):
    body = {"dp": cfg.dp, "global_batch": cfg.global_batch, "micro_batches": cfg.m, "zero": cfg.zero,
            "precision": cfg.precision}
    return "".join(f"# {h}\n" for h in header) + "".join(f"{k}={v}\n" for k, v in body.items())


def parse(text, facts, devices):
    kv = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    dp = int(kv["dp"])
    gb, m = int(kv["global_batch"]), int(kv["micro_batches"])
    return EngineConfig(engine="toy", global_batch=gb, dp=dp, m=m, mbs=gb // (dp * m), zero=int(kv["zero"]),
                        precision=kv["precision"], runtime="eager")
