"""Resume scenarios in ONE spawned 2-process gloo job (spawning costs seconds; scenarios reuse it).

    python -m tests.emit_workers.resume_job OUT.json

Each scenario trains a source plan for STEPS steps without interruption (the reference trajectory),
saving a checkpoint after SAVE_AT steps on the way; then, for each target plan, a freshly emitted
program (fresh model, other seed, so nothing but the checkpoint can carry the state) loads that
checkpoint and trains the remaining steps.  Rank 0 writes {scenario: {"ref": losses, target: losses}}."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback

STEPS, SAVE_AT, BATCH = 6, 3, 8
HOST = {t: {"weights": "host", "grads": "host", "optimizer": "host", "optimizer_kind": "sparse_adam"}
        for t in ("deep_emb.weight", "wide_emb.weight")}
# FTRL on the wide table, OffloadAdam (host master + moments) on the deep MLP's first layer
MIXED = {"deep_emb.weight": HOST["deep_emb.weight"],
         "wide_emb.weight": {"weights": "host", "grads": "host", "optimizer": "host", "optimizer_kind": "ftrl"},
         "deep.0.*": {"weights": "device", "grads": "host", "master_weights": "host", "optimizer": "host",
                      "optimizer_kind": "adam"}}
ROWS = 4     # rows per wide-deep field: every row is looked up in every batch (see _wd_batch)

# scenario: (model kind, source plan, {target name: target plan (and "kind" when the model differs)})
SCENARIOS = {
    "dp2": ("gpt", {"dp": 2}, {"same": {"dp": 2}, "zero1": {"dp": 2, "zero": 1},
                               "pp2": {"pp": 2, "schedule": "1f1b", "micro_batches": 2, "split_before": ["layers.1"]}}),
    "tp2": ("gpt", {"tp": 2, "tp_modules": {"layers.0.attn.qkv": "colwise", "layers.0.attn.proj": "rowwise",
                                            "layers.1.mlp.fc1": "colwise", "layers.1.mlp.fc2": "rowwise"}},
            {"dp2": {"dp": 2}}),
    "zero3": ("gpt", {"dp": 2, "zero": 3}, {"zero0": {"dp": 2, "zero": 0}}),
    # ZeRO-1's element-wise state shards (sapp/emit/dp/zero1.py) are gathered per parameter on save
    "zero1": ("gpt", {"dp": 2, "zero": 1}, {"same": {"dp": 2, "zero": 1}, "zero0": {"dp": 2, "zero": 0}}),
    "host": ("wd-host", {"dp": 2, "placement_groups": HOST},
             {"device": {"dp": 2, "kind": "wd-device"},
              # control: the same load with the optimizer state then dropped must NOT match the
              # reference (what the test proves is carried, the moments included, could be lost)
              "device-no-moments": {"dp": 2, "kind": "wd-device", "drop_optimizer_state": True}}),
    "host-mixed": ("wd-host", {"dp": 2, "placement_groups": MIXED}, {"same": {"dp": 2, "placement_groups": MIXED}}),
}


def _build(kind: str, seed: int):
    import torch
    import sapp.models as models
    from tests.emit_workers import zoo
    if kind == "gpt":
        return zoo.build("gpt", seed)
    torch.manual_seed(seed)
    # host tables train with sparse gradients (SparseAdam); on the device a dense table takes Adam
    m = models.get("wide-deep-tiny", device="cpu", rows_per_field=ROWS, sparse=(kind == "wd-host"))
    return m, models.loss_fn(m)


def _batch(kind: str, step: int):
    import torch
    from tests.emit_workers import zoo
    if kind == "gpt":
        return zoo.batch("gpt", BATCH, step)
    assert kind.startswith("wd-"), kind
    # every field looks up all of its ROWS rows in every batch: SparseAdam (lazy, touched rows only)
    # then updates exactly what Adam does, so host -> device is a like-for-like continuation
    g = torch.Generator().manual_seed(2000 + step)
    ids = (torch.arange(BATCH)[:, None] + torch.randint(0, ROWS, (1, 26), generator=g)) % ROWS
    return (torch.randn(BATCH, 13, generator=g), ids), torch.randint(0, 2, (BATCH,), generator=g).float()


def _program(kind, plan_kw, seed):
    from sapp.emit import emit
    from sapp.emit.runtime.train_state import model_names
    from tests.emit_workers.plans import make_plan
    model, loss_fn = _build(kind, seed)
    names = model_names(model)
    plan = make_plan(params=sum(p.numel() for p in model.parameters()), global_batch=BATCH, **plan_kw)
    prog = emit(model, plan, loss_fn=loss_fn, lr=1e-3, example_inputs=_batch(kind, 0)[0], check_fingerprint=False)
    return prog, names


def _train(prog, kind, steps):
    return [prog.step(*prog.shard(*_batch(kind, i))) for i in steps]


def _worker(rank, world, tmp, store, out):
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    torch.set_num_threads(1)
    from sapp.emit.runtime.checkpoint import Checkpointer
    results, code = {}, 0
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
        for name, (kind, source, targets) in SCENARIOS.items():
            prog, names = _program(kind, source, seed=0)
            ck = Checkpointer(os.path.join(tmp, name), keep=1, names=names, world=world)
            ref = _train(prog, kind, range(SAVE_AT))
            path = ck.save(prog, SAVE_AT, {"global_batch": BATCH})
            ref += _train(prog, kind, range(SAVE_AT, STEPS))
            results[name] = {"ref": ref}
            for tname, tplan in targets.items():
                tplan = dict(tplan)
                tkind, drop = tplan.pop("kind", kind), tplan.pop("drop_optimizer_state", False)
                prog, names = _program(tkind, tplan, seed=1)
                Checkpointer(os.path.dirname(path), names=names, world=world).load(prog, path)
                if drop:
                    for opt in prog.optimizers:
                        opt.state.clear()
                results[name][tname] = _train(prog, tkind, range(SAVE_AT, STEPS))
        dist.barrier()
    except BaseException:
        results["error"] = traceback.format_exc()
        code = 1
    if rank == 0 or code:
        with open(out if rank == 0 else f"{out}.rank{rank}", "w") as f:
            json.dump(results, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv):
    out = argv[0]
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(_worker, args=(2, tmp, os.path.join(tmp, "store"), out), nprocs=2, join=False,
                                 start_method="fork")
        try:
            while not ctx.join():
                pass
        except Exception as e:
            print(f"resume job failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
