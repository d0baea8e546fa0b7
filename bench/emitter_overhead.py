"""Emitter overhead: the emitted program's step against a hand-written torch loop making the same
FSDP2 / DTensor / pipelining calls, paired in one run.  `python -m bench.emitter_overhead [--rounds N]`

For the zoo's gpt-small (global batch 8, fp32, no recomputation) on 2 gloo ranks of this CPU, one plan per
layout -- dp2 (ZeRO-0: one flat all-reduce after backward, as emitted on a CPU), dp2 ZeRO-3 (fully_shard
per block + root), tp2 (parallelize_module: Megatron's column/row pairs, the head column-wise with a
replicated output, as the searched plan says) and pp2 (1F1B, 4 micro-batches, split where the plan
splits) -- is searched with the layout pinned and emitted; next to it, in the same processes, the same
model (same initial weights) is trained by a plain loop written here from torch's own calls.  Steps
alternate (emitted, hand, hand, emitted, ...) after warm-up, so machine drift hits both alike; each step
ends in the loss all-reduce both loops make, so ranks leave it together.  Reported per layout: median
wall and CPU (process) time per step of each, and the median over rounds of the paired ratio
emitted / hand - 1 (the overhead), and -- machine-independent -- the aten / c10d operators whose call
count in one profiled step differs between the two.  Target: <= 5% on every layout.

On a shared, loaded machine the wall figures are noisy; the CPU-time ratio and the paired median are the
ones to read.  Re-run on a quiet box for RESULTS."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL, GLOBAL_BATCH = "gpt-small", 8
_DEV = {"optimizer": "device"}
LAYOUTS = {
    "dp2": {"dp": 2, "tp": 1, "pp": 1, "zero": 0, "recompute": "none", "placement": _DEV},
    "zero3": {"dp": 2, "tp": 1, "pp": 1, "zero": 3, "recompute": "none", "placement": _DEV},
    "tp2": {"dp": 1, "tp": 2, "pp": 1, "zero": 0, "sp": False, "recompute": "none", "placement": _DEV},
    "pp2": {"dp": 1, "tp": 1, "pp": 2, "zero": 0, "recompute": "none", "placement": _DEV, "schedule": "1f1b",
            "micro_batches": 4},
}


# ---- the hand-written loops (torch calls only; nothing from sapp.emit) ------------------------------
def _loss_allreduce(loss, n):
    import torch.distributed as dist
    buf = loss.detach().float().reshape(()).clone() / n
    dist.all_reduce(buf)
    return float(buf)


def _plain_step(model, lf, opt, n, contributes=True):
    """forward, backward, optimizer step, loss all-reduce: the loop FSDP2 and DTensor need no more than."""
    def step(x, y):
        loss = lf(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return _loss_allreduce(loss if contributes else loss * 0, n)
    return step


def hand_dp(model, lf, lr):
    import torch
    import torch.distributed as dist
    n, params = dist.get_world_size(), list(model.parameters())
    opt = torch.optim.Adam(params, lr=lr, fused=True)

    def step(x, y):
        loss = lf(model(x), y)
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= n
        off = 0
        for p in params:
            p.grad.copy_(flat[off:off + p.numel()].view_as(p))
            off += p.numel()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return _loss_allreduce(loss, n)
    return step, lambda x, y: (x.chunk(n)[dist.get_rank()], y.chunk(n)[dist.get_rank()])


def hand_zero3(model, lf, lr):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    # reshard_after_forward=True on the root too, as the plan prices ZeRO-3 and sapp emits it: torch's
    # default (None) keeps the root gathered from forward to backward, one all-gather fewer per step
    # but the root's parameters held whole meanwhile -- a different layout, not emitter overhead
    for block in model.layers:
        fully_shard(block, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    return _plain_step(model, lf, torch.optim.Adam(model.parameters(), lr=lr), n), lambda x, y: (x.chunk(n)[dist.get_rank()], y.chunk(n)[dist.get_rank()])


def hand_tp(model, lf, lr):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    plan = {"head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(len(model.layers)):
        plan.update({f"layers.{i}.attn.qkv": ColwiseParallel(), f"layers.{i}.attn.proj": RowwiseParallel(),
                     f"layers.{i}.mlp.fc1": ColwiseParallel(), f"layers.{i}.mlp.fc2": RowwiseParallel()})
    parallelize_module(model, mesh, plan)
    # one loss contribution per replica (tp rank 0), as a user reporting the loss would
    return _plain_step(model, lf, torch.optim.Adam(model.parameters(), lr=lr), 1, dist.get_rank() == 0), \
        lambda x, y: (x, y)


def hand_pp(model, lf, lr, split, micro_batches):
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    rank, world = dist.get_rank(), dist.get_world_size()

    class First(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.layers = model.embed, nn.ModuleList(model.layers[:split])

        def forward(self, ids):
            x = self.embed(ids)
            for b in self.layers:
                x = b(x)
            return x

    class Last(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers, self.ln_f, self.head = nn.ModuleList(model.layers[split:]), model.ln_f, model.head

        def forward(self, x):
            for b in self.layers:
                x = b(x)
            return self.head(self.ln_f(x))
    mod = First() if rank == 0 else Last()
    stage = PipelineStage(mod, rank, world, torch.device("cpu"))
    sched = Schedule1F1B(stage, n_microbatches=micro_batches, loss_fn=lf)
    opt = torch.optim.Adam(mod.parameters(), lr=lr, fused=True)

    def step(x, y):
        losses = []
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=y, losses=losses)
        opt.step()
        opt.zero_grad(set_to_none=True)
        local = torch.stack([l.detach() for l in losses]).mean() if losses else torch.zeros(())
        return _loss_allreduce(local, 1)
    return step, lambda x, y: (x, y)


# ---- one rank --------------------------------------------------------------------------------------
def run_case(case, rank, warmup=2):
    import copy
    import torch
    import sapp.models as models
    from sapp.emit.checks import plan as checks
    from sapp.emit import emit
    from sapp.plan import Plan
    plan = Plan.load(case["plan_path"])
    torch.manual_seed(0)
    model = models.get(MODEL, device="cpu", dropout=0.0)     # no RNG: both loops see the same first loss
    twin = copy.deepcopy(model)
    lf = models.loss_fn(model)
    x, y = models.example_inputs(model, GLOBAL_BATCH, "cpu"), models.example_targets(model, GLOBAL_BATCH, "cpu")
    prog = emit(model, plan, lr=1e-3, example_inputs=x, check_fingerprint=False)
    lay = case["layout"]
    if lay == "pp2":
        split = int(checks.split_points(plan)[0].rsplit(".", 1)[1])
        hstep, hshard = hand_pp(twin, lf, 1e-3, split, int(plan.pipeline["micro_batches"]))
    else:
        hstep, hshard = {"dp2": hand_dp, "zero3": hand_zero3, "tp2": hand_tp}[lay](twin, lf, 1e-3)
    ex, ey = prog.shard(x, y)
    hx, hy = hshard(x[0] if isinstance(x, tuple) else x, y)
    first = (prog.step(ex, ey), hstep(hx, hy))       # same weights and data: the same first loss
    for _ in range(warmup):
        prog.step(ex, ey)
        hstep(hx, hy)

    def timed(fn, *a):
        w, c = time.perf_counter(), time.process_time()
        fn(*a)
        return time.perf_counter() - w, time.process_time() - c
    em, ha = [], []
    for r in range(case["rounds"]):
        pair = [("e", prog.step, ex, ey), ("h", hstep, hx, hy)]
        for tag, fn, a, b in (pair if r % 2 == 0 else pair[::-1]):
            (em if tag == "e" else ha).append(timed(fn, a, b))
    return {"first_loss": first, "emitted": em, "hand": ha, "op_diff": _op_diff((prog.step, ex, ey), (hstep, hx, hy))}


def _op_diff(emitted, hand) -> dict:
    """Operators (torch profiler names) whose call count in one step differs, {name: [emitted, hand]}:
    the machine-independent part of the comparison (the extra work, if any, by name)."""
    from torch.profiler import ProfilerActivity, profile
    counts = []
    for fn, a, b in (emitted, hand):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn(a, b)
        counts.append({k.key: k.count for k in prof.key_averages() if k.key.startswith(("aten::", "c10d::"))})
    e, h = counts
    return {k: [e.get(k, 0), h.get(k, 0)] for k in sorted(set(e) | set(h)) if e.get(k, 0) != h.get(k, 0)}


# ---- driver -----------------------------------------------------------------------------------------
def summarise(layout, per_rank) -> dict:
    """Rank 0's figures (steps end together in the loss all-reduce) plus the slower rank's CPU time."""
    r0 = per_rank["0"][layout]
    if "error" in r0:
        return {"layout": layout, "error": r0["error"]}
    em, ha = r0["emitted"], r0["hand"]
    ratio = [e[0] / h[0] - 1 for e, h in zip(em, ha)]
    cpu = {k: max(statistics.median(x[1] for x in per_rank[r][layout][k]) for r in per_rank) for k in ("emitted", "hand")}
    return {"layout": layout, "steps": len(em), "emitted_wall_s": statistics.median(e[0] for e in em),
            "hand_wall_s": statistics.median(h[0] for h in ha), "paired_overhead": statistics.median(ratio),
            "emitted_cpu_s": cpu["emitted"], "hand_cpu_s": cpu["hand"], "cpu_overhead": cpu["emitted"] / cpu["hand"] - 1,
            "first_loss": r0["first_loss"], "op_diff": r0.get("op_diff", {})}


def run(layouts=tuple(LAYOUTS), rounds=20, timeout=900) -> list:
    import sapp
    import sapp.models as models
    from sapp.api import search
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for lay in layouts:
            plan = search(models.get(MODEL, device="meta"), sapp.Cluster.parse("cpu:gpus=2"),
                          global_batch=GLOBAL_BATCH, constraints=LAYOUTS[lay])
            path = os.path.join(tmp, lay + ".json")
            plan.save(path)
            cases.append({"id": lay, "layout": lay, "plan_path": path, "rounds": rounds})
        cp, op = os.path.join(tmp, "cases.json"), os.path.join(tmp, "out.json")
        with open(cp, "w") as f:
            json.dump(cases, f)
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.run([sys.executable, "-m", "bench.emitter_overhead", "--job", cp, op], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
        if not os.path.exists(op):
            raise RuntimeError(f"emitter-overhead job wrote nothing: {proc.stderr[-2000:]}")
        with open(op) as f:
            got = json.load(f)
    per = got["ranks"]
    bad = {r: v["__job__"]["error"][-1500:] for r, v in per.items() if "__job__" in v}
    if bad or len(per) < 2:
        raise RuntimeError(f"emitter-overhead ranks failed ({got['failed']}): {bad or sorted(per)}")
    return [summarise(lay, per) for lay in layouts]


def table(rows) -> str:
    out = [f"{'layout':7s} {'steps':>5s} {'emitted ms':>10s} {'hand ms':>8s} {'paired':>7s} "
           f"{'emit CPU ms':>11s} {'hand CPU ms':>11s} {'CPU':>7s}  first loss (emitted, hand)"]
    for r in rows:
        if "error" in r:
            out.append(f"{r['layout']:7s} ERROR {r['error'][:120]}")
            continue
        out.append(f"{r['layout']:7s} {r['steps']:>5d} {r['emitted_wall_s'] * 1e3:>10.1f} {r['hand_wall_s'] * 1e3:>8.1f} "
                   f"{r['paired_overhead'] * 100:>6.1f}% {r['emitted_cpu_s'] * 1e3:>11.1f} {r['hand_cpu_s'] * 1e3:>11.1f} "
                   f"{r['cpu_overhead'] * 100:>6.1f}%  {r['first_loss'][0]:.6f}, {r['first_loss'][1]:.6f}")
        out.append(f"        operators whose count differs in one step (emitted, hand): {r['op_diff'] or 'none'}")
    return "\n".join(out)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--job":
        from bench.gloo_job import job
        job(run_case, 2, argv[1], argv[2])
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.emitter_overhead")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    rows = run(tuple(a.layouts.split(",")), a.rounds)
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
