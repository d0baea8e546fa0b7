"""Plans for the HF emission matrix: sapp's own search with the configuration's degrees pinned.

At hidden 64 the CPU preset's collective latency makes tensor parallelism a loss, so for tp > 1 the
search runs on a cluster whose links cost nothing and whose compute is slow: the tp level then shards
what it can, and the emitted layout is the one the search chose (not a hand-written one)."""
from __future__ import annotations

CONFIGS = {
    "dp2": {"dp": 2, "tp": 1, "pp": 1},
    "pp2": {"dp": 1, "tp": 1, "pp": 2, "schedule": "1f1b"},
    "tp2": {"dp": 1, "tp": 2, "pp": 1},
    "dp2xpp2": {"dp": 2, "tp": 1, "pp": 2, "schedule": "1f1b"},
    "pp2xtp2": {"dp": 1, "tp": 2, "pp": 2, "schedule": "1f1b", "sp": False},
    # ZeRO-1's owned slices of vocabulary-split tables (their gradients come back whole from DTensor)
    "dp2xtp2-zero1": {"dp": 2, "tp": 2, "pp": 1, "zero": 1},
    "tp2+sp": {"dp": 1, "tp": 2, "pp": 1, "sp": True},
    "pp2xtp2+sp": {"dp": 1, "tp": 2, "pp": 2, "schedule": "1f1b", "sp": True},
    # Llama 3's interleaved layout: 2 chunks a stage over 2 layers, so the model's first chunk holds the
    # embedding alone and its last the final norm, head and loss alone
    "pp2-glue": {"dp": 1, "tp": 1, "pp": 2, "schedule": "interleaved", "virtual_chunks": 2, "micro_batches": 4},
}
TP_CLUSTER = "cpu:gpus={n},peak_flops=1e8,intra_latency=0,intra_bw=1e15,op_overhead=0,sharded_op_overhead=0"
BATCH = 8


def world(config: str) -> int:
    c = CONFIGS[config]
    return c["dp"] * c["tp"] * c["pp"]


def search_plan(kind: str, config: str, path) -> str:
    """Search `kind` with `config` pinned and save the plan to `path`; returns the path.  Errors
    (capture, search) propagate: the matrix reports them as the case's failure."""
    from sapp.api import search
    from tests.emit_workers import hf_models
    cons = dict({"zero": 0}, **CONFIGS[config])
    n = world(config)
    cluster = TP_CLUSTER.format(n=n) if cons["tp"] > 1 else f"cpu:gpus={n}"
    model, loss_fn = hf_models.build(kind, device="meta")
    x, y = hf_models.batch(kind, BATCH, 0)
    # the loss is captured with the model: the emitted program trains with it, and the last stage's
    # memory (logits, the softmax kept for backward) is priced where it runs
    plan = search(model, cluster, global_batch=BATCH, example_inputs=x, constraints=cons, loss_fn=loss_fn, targets=y)
    plan.save(path)
    return str(path)
