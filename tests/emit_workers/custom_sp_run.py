"""tp=2 with SP pinned for a small model class of a test, 2 forked gloo ranks, 3 steps, against one
process trained the same way (tests/test_sp_length_readers.py).

    python -m tests.emit_workers.custom_sp_run MODULE:CLASS PLAN.json OUT.json"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback

from tests.emit_workers.harness import finish, fork_ranks

STEPS, BATCH = 3, 4
TP_CLUSTER = "cpu:gpus=2,peak_flops=1e8,intra_latency=0,intra_bw=1e15,op_overhead=0,sharded_op_overhead=0"


def _cls(spec):
    """The class `name` of the Python file `path` ("path:name": a test file, by its path)."""
    import importlib.util
    path, _, name = spec.rpartition(":")
    sp = importlib.util.spec_from_file_location("sapp_custom_sp_model", path)
    mod = importlib.util.module_from_spec(sp)
    sys.modules[sp.name] = mod
    sp.loader.exec_module(mod)
    return getattr(mod, name)


def _data(model_cls, step):
    import torch
    g = torch.Generator().manual_seed(100 + step)
    m = sys.modules[model_cls.__module__]
    ids = torch.randint(0, m.VOCAB, (BATCH, m.SEQ + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def _worker(rank, world, cases, out_dir, store):
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    torch.set_num_threads(1)
    try:
        from sapp.emit import emit
        from sapp.plan import Plan
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=30))
        cls = _cls(cases[0]["model"])
        torch.manual_seed(0)
        model = cls()
        x, _ = _data(cls, 0)
        prog = emit(model, Plan.load(cases[0]["plan"]), lr=1e-3, example_inputs=(x,), check_fingerprint=False)
        losses = []
        for step in range(STEPS):
            x, y = _data(cls, step)
            losses.append(prog.step(*prog.shard((x,), y)))
        out = {"losses": losses}
        dist.destroy_process_group()
    except BaseException:
        out = {"error": traceback.format_exc()[-3000:]}
    finish(out_dir, rank, out)


def single(cls) -> list:
    import torch
    from sapp.emit.runtime.program import default_loss
    torch.manual_seed(0)
    model = cls()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    out = []
    for step in range(STEPS):
        x, y = _data(cls, step)
        opt.zero_grad()
        loss = default_loss(model(x), y)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def run(cls, tmp_path):
    """(rank 0's losses, one process's) for `cls` under a tp=2 + SP plan; the plan is searched here."""
    import torch
    from sapp.api import search
    from sapp.emit.runtime.program import default_loss
    with torch.device("meta"):
        meta = cls()
    x, y = _data(cls, 0)
    plan = search(meta, TP_CLUSTER, global_batch=BATCH, example_inputs=(x,), loss_fn=default_loss, targets=y,
                  constraints={"dp": 1, "tp": 2, "pp": 1, "sp": True, "zero": 0})
    path = os.path.join(tmp_path, "plan.json")
    plan.save(path)
    ranks = launch(f"{sys.modules[cls.__module__].__file__}:{cls.__qualname__}", path, tmp_path, timeout=120)
    return ranks["0"]["losses"], single(cls), plan


def launch(spec, plan_path, tmp_path, timeout) -> dict:
    """{rank: its result} of this job run in its own process on `plan_path` for the class `spec`
    ("path:name"); asserts no rank failed or raised."""
    out = os.path.join(str(tmp_path), "out.json")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-m", "tests.emit_workers.custom_sp_run", spec, plan_path, out], check=True,
                   timeout=timeout, env=env, cwd=root)
    with open(out) as f:
        res = json.load(f)
    errs = [r["error"] for r in res["ranks"].values() if "error" in r]
    assert not errs and not res["failed"], (res["failed"], errs[:1])
    return res["ranks"]


if __name__ == "__main__":
    spec, plan_path, out_path = sys.argv[1:4]
    failed, per_rank = fork_ranks(_worker, 2, [{"model": spec, "plan": plan_path}])
    with open(out_path, "w") as f:
        json.dump({"failed": failed, "ranks": {str(k): v for k, v in per_rank.items()}}, f)
    sys.exit(0)
