"""One rank of `sapp run` (started by torchrun):  python -m sapp.emit.worker PLAN --model NAME ...

Logs `[rank r] step i loss x` every step; rank 0 ends with a summary of the measured step time next to
the plan's prediction and, with --out, a JSON result.  SAPP_FAULT="RANK:STEP" makes that rank exit(1)
at that step (used to test that a dead rank ends the whole job quickly)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="sapp.emit.worker")
    p.add_argument("plan")
    p.add_argument("--model", required=True)
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--data")
    p.add_argument("--out")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=20.0)
    return p.parse_args(argv)


def model_overrides(pairs) -> dict:
    out = {}
    for kv in pairs:
        k, _, v = kv.partition("=")
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def _fault():
    spec = os.environ.get("SAPP_FAULT", "")
    if not spec:
        return None
    r, _, s = spec.partition(":")
    return int(r), int(s)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist
    import sapp.models as models  # not `from .. import`: sapp.__getattr__ recurses on it
    from ..errors import SappError
    from ..plan import Plan
    from . import data as data_mod, dist as dist_mod, emit
    rank, world = dist_mod.rank_world()
    try:
        plan = Plan.load(args.plan)
        torch.manual_seed(args.seed)     # identical initial weights on every rank
        model = models.build(args.model, device="cpu", **model_overrides(args.model_arg))   # zoo | factory | HF config
        gb = plan.model.get("global_batch")
        if not gb:
            raise SappError("plan has no model.global_batch; search it with --global-batch")
        batches = data_mod.Batches(int(gb), data=data_mod.load(args.data) if args.data else None, model=model)
        example = batches(0)[0]
        device = dist_mod.default_device()
        if world > 1:
            dist_mod.init(device, timeout_s=args.timeout)
        # `sapp run` fingerprints the model once before launching; a bare torchrun launch checks here
        prog = emit(model, plan, lr=args.lr, optimizer=args.optimizer, device=device, example_inputs=example,
                    name=args.model, check_fingerprint=os.environ.get("SAPP_RUN_PRECHECKED") != "1")
    except SappError as e:
        print(f"[rank {rank}] error: {e}", file=sys.stderr, flush=True)
        os._exit(2)
    fault = _fault()
    losses, times = [], []
    # a step's time runs from the end of the one before (the first: from its own start).  Each step
    # ends in a loss all-reduce every rank leaves together, so this is the cadence all ranks share;
    # rank 0's own start can lag (its log line, the scheduler), and with more processes than cores
    # the late rank then computes alone on a free core: timed from its start, that step looked up to
    # 2x faster than the others (4 processes on 2 cores: 149 ms after a 404 ms one, median 290 ms)
    last_end = None
    try:
        for i in range(args.steps):
            if fault and fault == (rank, i):
                print(f"[rank {rank}] SAPP_FAULT: exiting at step {i} at t={time.time():.3f}", file=sys.stderr, flush=True)
                os._exit(1)
            x, y = prog.shard(*batches(i))
            t0 = time.perf_counter()
            loss = prog.step(x, y)
            end = time.perf_counter()
            times.append(end - (t0 if last_end is None else last_end))
            last_end = end
            losses.append(loss)
            print(f"[rank {rank}] step {i} loss {loss:.6f} ({times[-1] * 1e3:.1f} ms)", flush=True)
    except Exception as e:  # a peer died or timed out: say so in one line and end this rank
        msg = str(e).strip().splitlines()
        print(f"[rank {rank}] error at step {len(losses)}: {type(e).__name__}: {msg[0] if msg else ''}"
              f" (another rank probably died; see its log)", file=sys.stderr, flush=True)
        os._exit(1)
    if rank == 0:
        summary(args, plan, world, prog, losses, times)
    if world > 1:
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: torch/gloo teardown with sparse gradients occasionally aborts at interpreter exit
    os._exit(0)


def summary(args, plan, world, prog, losses, times):
    steady = times[1:] if len(times) > 1 else times
    measured = statistics.median(steady) if steady else float("nan")
    predicted = plan.predicted.get("step_time_s")
    par = plan.parallel
    backend = "nccl" if prog.device.type == "cuda" else "gloo"
    print(f"sapp run: {args.model} on {world} process(es) (dp={par['dp']} tp={par['tp']} pp={par['pp']}, zero={prog.zero}, {prog.precision}, "
          f"{backend}/{prog.device.type}), {len(losses)} steps", flush=True)
    ratio = measured / predicted if predicted else None
    print(f"sapp run: measured step time {measured * 1e3:.2f} ms (median of {len(steady)} steps)   predicted "
          f"{predicted * 1e3 if predicted else float('nan'):.3f} ms   measured/predicted {ratio if ratio else float('nan'):.2f}x",
          flush=True)
    if losses:
        print(f"sapp run: loss {losses[0]:.6f} -> {losses[-1]:.6f}", flush=True)
    for note in prog.notes:
        print(f"sapp run: note: {note}", flush=True)
    if args.out:
        import torch
        peak = torch.cuda.max_memory_allocated(prog.device) if prog.device.type == "cuda" else None
        res = {"model": args.model, "devices": world, "parallel": dict(par), "zero": prog.zero, "backend": backend,
               "precision": prog.precision, "peak_memory_bytes": peak,
               "steps": len(losses), "losses": losses, "step_times_s": times, "measured_step_time_s": measured,
               "predicted_step_time_s": predicted, "measured_over_predicted": ratio, "notes": prog.notes}
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    sys.exit(main())
