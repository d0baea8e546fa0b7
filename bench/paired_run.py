"""One rank of a paired run (started by torchrun from bench.calibration_accuracy --paired):

    torchrun --nproc-per-node P -m bench.paired_run PLAN --model NAME --steps N --rounds R --out RESULT

Runs the emitted program of PLAN and the calibration's reference block (`sapp.calibrate.REFERENCE`,
forward + backward in lockstep, exactly as `sapp calibrate` times it) alternately in the same
processes: R rounds of an untimed warm-up step, N timed training steps, then the reference's figure
(the median of `REFERENCE_STEPS` steps).  On a shared machine whose speed
moves by 20% within minutes, the reference timed seconds apart from the plan, in the same processes,
says how fast the machine runs *during* the plan's steps; the calibration's reference time says how
fast it ran when calibrated.  Rank 0 writes the step times of both to RESULT (JSON)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.paired_run")
    ap.add_argument("plan")
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist

    import sapp.models as models
    from sapp.calibrate import reference_step_seconds
    from sapp.emit.runtime import data as data_mod
    from sapp.emit.runtime import dist as dist_mod
    from sapp.emit import emit
    from sapp.plan import Plan

    plan = Plan.load(args.plan)
    rank, world = dist_mod.rank_world()
    torch.manual_seed(0)
    model = models.get(args.model, device="cpu")
    batches = data_mod.Batches(int(plan.model["global_batch"]), model=model)
    device = dist_mod.default_device()
    if world > 1:
        dist_mod.init(device, timeout_s=120)
    prog = emit(model, plan, device=device, example_inputs=batches(0)[0], name=args.model)
    steps, refs, i = [], [], 0
    for _ in range(args.rounds):
        # the first step of a round follows reference steps (other tensors in cache): warm-up, untimed
        prog.step(*prog.shard(*batches(i)))
        i += 1
        last = time.perf_counter()
        for _ in range(args.steps):
            prog.step(*prog.shard(*batches(i)))     # ends in the loss all-reduce every rank leaves together
            i += 1
            now = time.perf_counter()
            steps.append(now - last)
            last = now
        refs.append(reference_step_seconds(torch, dist, world, min_time=0.1))
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"step_times_s": steps, "reference_s": refs, "measured_step_time_s": statistics.median(steps),
                       "reference_median_s": statistics.median(refs)}, f, indent=1)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
