"""Expert-parallel moe-tiny runs on gloo in one forked job, and the single-process reference.

    python -m tests.emit_workers.ep_job WORLD CASES.json OUT.json

A case: {"id", "dp", "ep", "steps", "batch", "zero" (optional, 0), and for a pipeline "pp", "schedule",
"micro_batches", "split_before", "virtual_chunks" (optional)}; every rank writes its losses per step and,
with "params": true, its parameters after the last step (the reference writes all of them).  "model_args"
(optional) overrides moe-tiny's shape (e.g. {"l": 4}) for the rank and the reference alike."""
from __future__ import annotations

import json
import os
import sys
import traceback
from tests.emit_workers import joblock

SEED = 0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def launch(world, cases, tmp_path, timeout):
    """Run `cases` as one forked job of `world` gloo ranks (this module as a subprocess, bounded by
    `timeout` seconds) and return its output, asserting that it ran without a failure."""
    cpath, opath = tmp_path / "cases.json", tmp_path / "out.json"
    cpath.write_text(json.dumps(cases))
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = joblock.run([sys.executable, "-m", "tests.emit_workers.ep_job", str(world), str(cpath), str(opath)],
                       cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(opath.read_text())
    assert out["failed"] is None and not out["errors"], (out["failed"], out["errors"])
    return out


def _model(model_args=None):
    import torch
    import sapp.models as zoo
    torch.manual_seed(SEED)
    return zoo.get("moe-tiny", device="cpu", **(model_args or {}))


def _batch(step, batch, model_args=None):
    import sapp.models as zoo
    m = _model(model_args)
    g = step + 1      # a different batch each step (example_* are seeded, so offset the ids)
    x = zoo.example_inputs(m, batch * (g + 1))[0][batch * g:]
    y = zoo.example_targets(m, batch * (g + 1))[batch * g:]
    return x, y


def _plan(dp, ep, batch, params, zero=0, case=None):
    from tests.emit_workers.plans import make_plan
    case = case or {}
    pipe = {k: case[k] for k in ("pp", "schedule", "micro_batches", "split_before", "virtual_chunks") if k in case}
    plan = make_plan(name="moe-tiny", params=params, global_batch=batch, dp=dp, zero=zero, **pipe)
    d = plan.to_dict() if hasattr(plan, "to_dict") else plan._d
    if ep > 1:
        d["parallel"]["ep"] = ep
    from sapp.plan import Plan
    return Plan(d)


def reference(steps, batch, model_args=None, params=False):
    import torch
    import sapp.models as zoo
    m = _model(model_args)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    out = []
    for i in range(steps):
        x, y = _batch(i, batch, model_args)
        loss = zoo.loss_fn(m)(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    if params:
        return {"losses": out, "params": {n: p.detach().tolist() for n, p in m.named_parameters()}}
    return out


def _worker(rank, world, cases, out_dir, store):
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    torch.set_num_threads(1)
    results, code = {}, 0
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=20))
        from sapp.emit import emit
        import sapp.models as zoo
        for case in cases:
            margs = case.get("model_args")
            m = _model(margs)
            plan = _plan(case["dp"], case["ep"], case["batch"], sum(p.numel() for p in m.parameters()),
                         case.get("zero", 0), case)
            prog = emit(m, plan, loss_fn=zoo.loss_fn(m), lr=1e-3, check_fingerprint=False,
                        example_inputs=_batch(0, case["batch"], margs)[0])
            losses = []
            for i in range(case["steps"]):
                x, y = _batch(i, case["batch"], margs)
                xs, ys = prog.shard(x, y)
                losses.append(prog.step(xs, ys))
            # stage modules keep the un-split model's parameter names (ep >= 2 runs without DDP wrappers)
            named = {n: p for mod in prog.modules for n, p in mod.named_parameters()}
            experts = sum(p.numel() for n, p in named.items() if n.endswith(("w_in", "w_out")))
            man = getattr(prog, "manifest", None) or {}
            results[case["id"]] = {"losses": losses, "expert_numel": experts, "ep": prog.ep, "zero": prog.zero,
                                   "manifest_ep": man.get("ep"), "manifest_pp": man.get("pp"),
                                   "manifest_ep_group": man.get("ep_group"), "stages": prog.stage_indices,
                                   "expected": getattr(prog, "manifest_expected", None), "manifest": man}
            if case.get("params"):
                results[case["id"]]["params"] = {n: p.detach().tolist() for n, p in named.items()}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        results["error"] = traceback.format_exc()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv):
    from tests.emit_workers.harness import fork_ranks
    world, cases_path, out_path = int(argv[0]), argv[1], argv[2]
    with open(cases_path) as f:
        cases = json.load(f)
    failed, per_rank = fork_ranks(_worker, world, cases)
    out = {"failed": failed, "errors": {r: v["error"] for r, v in per_rank.items() if "error" in v},
           "ranks": per_rank,
           "ref": {c["id"]: reference(c["steps"], c["batch"], c.get("model_args"), c.get("params", False))
                   for c in cases}}
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
