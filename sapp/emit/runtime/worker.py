"""One rank of `sapp run`: main(), which torchrun starts through sapp/commands/run_worker.py
(python -m sapp.commands.run_worker PLAN --model NAME ...): the entry hands it the re-pricing and the
re-planning search, which the emitter sits below and does not import.

Order: plan -> model -> data -> process group -> checkpoint directory check -> emit -> resume ->
steps (checkpoint every N) -> summary.  Logs each step (sapp/emit/runtime/train_log.py); rank 0 ends with the
measured step time next to the plan's prediction and, with --out, a JSON result whose `losses` cover
every step of the run, restored ones included.

Checkpoints (sapp/emit/runtime/checkpoint.py): --checkpoint-dir D saves after every --checkpoint-every N steps
and after the last; --resume continues from the newest intact checkpoint in D (or from the one named),
under this plan whatever plan wrote it.  A worker restarted by torchrun (--max-restarts,
TORCHELASTIC_RESTART_COUNT > 0) resumes from D by itself.

SAPP_FAULT="RANK:STEP" makes that rank exit(1) at that step, "RANK:STEP:kill" SIGKILL itself,
"RANK:STEP:raise" raise an exception (tests: a dead rank ends the job; a killed rank restarts from
the last checkpoint; a failure is reported once, sapp/emit/runtime/failure.py); only in a job's first
attempt, so the restarted workers run through.  "RANK:STEP:savekill" and "RANK:STEP:hold-<point>"
act inside a save, before a commit or as a group forms (sapp/emit/runtime/checkpoint.py, planted_hold).  SAPP_TEST_PACE=S sleeps S seconds before each step
(tests that must act while a job runs).

--elastic: a group of another size than the plan's re-plans for it first (sapp/emit/runtime/elastic.py).
A mixed-cluster plan (a plan with `groups`): --group names this rank's group, else ranks take the
groups in plan order; each trains its rows of the global batch (sapp/emit/runtime/hetero_run.py)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="sapp.commands.run_worker")
    p.add_argument("plan")
    p.add_argument("--model", required=True)
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--data")
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--out")
    p.add_argument("--log-json")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--keep", type=int, default=2)
    p.add_argument("--resume", nargs="?", const="latest")
    p.add_argument("--resume-partial", dest="resume_partial", action="store_true")
    p.add_argument("--elastic", action="store_true")
    p.add_argument("--allow-mismatch", action="store_true")
    p.add_argument("--group")
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


def _restarted() -> bool:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0


def _fault():
    spec = os.environ.get("SAPP_FAULT", "")
    if not spec or _restarted():
        return None
    r, s, *how = spec.split(":")
    if how and how[0] not in ("exit", "kill", "raise"):      # a fault inside a save or a hold: not in the step loop
        return None
    return int(r), int(s), (how[0] if how else "exit")


def _planted_fault(step):
    """SAPP_FAULT="RANK:STEP:raise": an exception raised from inside this rank's step loop (tests:
    the report shows its frames once, the other ranks say they stopped because of it)."""
    raise RuntimeError(f"SAPP_FAULT: planted error at step {step}")


def _data(args, gb, model):
    from . import data as data_mod
    if args.data and data_mod.is_factory(args.data):
        return data_mod.Batches(gb, dataset=data_mod.make_dataset(args.data), shuffle=args.shuffle, seed=args.seed)
    return data_mod.Batches(gb, data=data_mod.load(args.data) if args.data else None, model=model,
                            shuffle=args.shuffle, seed=args.seed)


def _resume(args, ckpt, prog, gb, log):
    """(first step, losses so far) from the checkpoint to resume from, or (0, [])."""
    from .train_state import CheckpointError
    found = ckpt.find(None if args.resume in (None, "latest") else args.resume, writing=bool(args.checkpoint_dir),
                      run=run_id(), restarted=_restarted() or getattr(args, "elastic", False))
    if found is None:
        log(f"sapp run: no checkpoint in {args.checkpoint_dir} yet; starting from step 0")
        return 0, []
    path, meta = found
    from .checkpoint import identity_diff
    if meta.get("global_batch") != gb:
        raise CheckpointError(f"checkpoint {path} was trained with global batch {meta.get('global_batch')}, this plan "
                              f"has {gb}; search the new plan with --global-batch {meta.get('global_batch')}")
    differs, same = identity_diff(meta.get("model_state") or {}, ckpt.names.shapes)
    order = _order(meta.get("data", "synthetic"), meta.get("shuffle", False), meta.get("seed", 0))
    if order != _order(args.data or "synthetic", args.shuffle, args.seed) and not args.resume_partial:
        raise CheckpointError(f"checkpoint {path} was trained on {order}, this run reads "
                              f"{_order(args.data or 'synthetic', args.shuffle, args.seed)}; pass the same --data / "
                              "--shuffle / --seed, or --resume-partial to continue on other data deliberately", every_rank=True)
    if differs and not args.resume_partial:
        raise CheckpointError(f"checkpoint {path} was written for another model: {differs}; resume with the model "
                              f"(and --model-arg settings) it was trained with, or --resume-partial to load the "
                              f"{len(same)} matching entries", every_rank=True)
    ckpt.load(prog, path, only=same if args.resume_partial else None)
    log(f"sapp run: resumed from {path} (step {meta['step']}, {meta['data_position']} samples seen, "
        f"written under dp={meta['parallel']['dp']} tp={meta['parallel']['tp']} pp={meta['parallel']['pp']} zero={meta['zero']})"
        + (f"; partial: {len(same)} of {len(ckpt.names.shapes)} entries loaded" + (f" ({differs})" if differs else "")
           if args.resume_partial else ""))
    args.parent = {"checkpoint": os.path.basename(path), "step": int(meta["step"]), "run": meta.get("run")}
    return int(meta["step"]), list(meta.get("losses", []))


def run_id() -> str:
    """The job's id, the same on every node, rank and torchrun restart of it: torchrun's rendezvous id
    (`sapp run` draws one per single-node launch; several nodes share their --rdzv-id)."""
    return os.environ.get("SAPP_RUN_ID") or os.environ.get("TORCHELASTIC_RUN_ID") or ""


def _order(data, shuffle, seed) -> str:
    return f"--data {data} " + (f"shuffled with --seed {seed}" if shuffle else "in order")


def main(argv=None, *, reprice=None, replan=None) -> int:
    from .lifeline import bind_to_parent
    bind_to_parent(f"rank {os.environ.get('RANK', '?')}")     # its agent killed: end, do not train on
    args = parse_args(argv)
    import torch.distributed as dist
    from ...errors import SappError
    from . import dist as dist_mod
    from .train_log import log_error
    rank, world = dist_mod.rank_world()
    try:
        job = _prepare(args, rank, world, reprice, replan)
    except SappError as e:
        _say(rank, e)
        log_error(args.log_json, rank, None, str(e))
        os._exit(2)
    losses, times = _train(args, rank, job)
    job.log.close()
    if rank == 0:
        summary(args, job.plan, world, job.prog, losses, times, job.start)
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


@dataclass
class _Job:
    """What the step loop needs, as _prepare leaves it."""
    plan: object            # this rank's Plan (its group's, re-planned for the world where elastic)
    prog: object            # the emitted Program
    gb: int                 # global batch
    batches: object         # the data (data.Batches)
    share: dict | None      # a mixed-cluster group's rows of the batch
    ckpt: object            # the Checkpointer, or None
    log: object             # the StepLog
    start: int              # the first step to run (a resumed checkpoint's)
    losses: list            # the losses so far (a resumed checkpoint's)
    world: int


def _prepare(args, rank, world, reprice, replan) -> _Job:
    """Plan -> model -> data -> process group -> checkpoint directory check -> emit -> resume; a bad
    input raises SappError."""
    import torch
    import sapp.models as models  # not `from .. import`: sapp.__getattr__ recurses on it
    from ...errors import SappError
    from ...plan import load_any
    from . import checkpoint as ckpt_mod, dist as dist_mod, hetero_run
    from .. import emit
    from .train_log import StepLog
    from .train_state import model_names
    # a restarted group, and every group of an elastic job (a joining node's agent has not restarted),
    # resumes the newest checkpoint: every rank decides alike
    resume = args.resume or ((_restarted() or getattr(args, "elastic", False)) and args.checkpoint_dir and "latest")
    kind, doc = load_any(args.plan)         # read and checked once per rank
    mixed = doc if kind == "mixed" else None   # a mixed-cluster plan: this rank's group's, over the job
    group = (args.group or hetero_run.by_position(mixed, rank)) if mixed else None
    plan = hetero_run.rank_plan(mixed, group, world) if mixed else doc
    torch.manual_seed(args.seed)     # identical initial weights on every rank
    model = models.build(args.model, device="cpu", **model_overrides(args.model_arg))   # zoo | factory | HF config
    gb = plan.model.get("global_batch")
    if not gb:
        raise SappError("plan has no model.global_batch; search it with --global-batch")
    gb = int(gb)
    batches = _data(args, gb, model)
    example = batches(0)[0]
    device = dist_mod.default_device()
    if world > 1:
        dist_mod.init(device, timeout_s=args.timeout)
    share = hetero_run.place(mixed, group, rank, world) if mixed else None
    ckpt_mod.planted_hold("join", rank)      # tests: a node that joins a group and dies before its first step
    if getattr(args, "elastic", False) and not mixed:      # a group of another size than the plan's: re-plan for it (sapp/emit/runtime/elastic.py)
        from .elastic import plan_for_world
        from .checkpoint_find import committed
        regroup = _restarted() or bool(committed(args.checkpoint_dir))     # not the job's first group
        plan = plan_for_world(args, plan, world, int(os.environ.get("LOCAL_WORLD_SIZE", world)), rank, regroup,
                              say=(lambda m: print(m, flush=True)) if rank == 0 else (lambda m: None), replan=replan)
    ckpt = None
    if resume == "latest" and not args.checkpoint_dir:
        raise SappError("--resume without a checkpoint path needs --checkpoint-dir (where to look)")
    if args.checkpoint_dir or resume:
        ckpt = ckpt_mod.Checkpointer(args.checkpoint_dir or os.path.dirname(os.path.abspath(args.resume)),
                                     keep=args.keep, names=model_names(model), world=world)
    if args.checkpoint_dir:      # before any training: an unwritable or full directory is refused now
        ckpt.check(ckpt_mod.estimate_bytes(int(plan.model.get("params") or 0), args.optimizer), bool(resume))
    # `sapp run` fingerprints the model once before launching; a bare torchrun launch checks here
    prog = emit(model, plan, lr=args.lr, optimizer=args.optimizer, device=device, example_inputs=example,
                name=args.model, check_fingerprint=os.environ.get("SAPP_RUN_PRECHECKED") != "1",
                allow_mismatch=args.allow_mismatch, reprice=reprice)
    if share:
        hetero_run.weigh(prog, share)
    log = StepLog(rank, args.steps, gb, device, json_path=args.log_json)
    if rank == 0 and args.log_json:      # what `sapp calibrate --from-run` reads the measured steps against
        from .train_log import log_event
        log_event(args.log_json, 0, "start", plan=os.path.abspath(args.plan), devices=world, model=args.model)
    start, losses = _resume(args, ckpt, prog, gb, log.note) if resume else (0, [])
    return _Job(plan, prog, gb, batches, share, ckpt, log, start, losses, world)


def _train(args, rank, job: _Job):
    """The steps from job.start (checkpoint every N): (losses, step times); a failing rank ends the
    process (exit 2 for a SappError, 1 for anything else) after its one-line report."""
    from ...errors import SappError
    from .train_log import log_error
    plan, prog, batches, share, ckpt, log, losses = (job.plan, job.prog, job.batches, job.share, job.ckpt, job.log,
                                                     job.losses)
    if log.bar is not None:
        log.bar.update(job.start)
    fault = _fault()
    pace = float(os.environ.get("SAPP_TEST_PACE", "0") or 0)     # tests: seconds added to each step
    times = []
    meta = {"global_batch": job.gb, "data": args.data or "synthetic", "shuffle": bool(args.shuffle), "seed": args.seed, "parallel": dict(plan.parallel), "zero": prog.zero, "model": args.model,
            "plan_fingerprint": plan.model.get("fingerprint", ""), "world": job.world,
            # lineage: which job wrote the step, and which checkpoint that job started from
            "run": run_id(), "parent": getattr(args, "parent", None)}
    # a step's time runs from the end of the one before (the first: from its own start).  Each step
    # ends in a loss all-reduce every rank leaves together, so this is the cadence all ranks share;
    # rank 0's own start can lag (its log line, the scheduler), and with more processes than cores
    # the late rank then computes alone on a free core: timed from its start, that step looked up to
    # 2x faster than the others (4 processes on 2 cores: 149 ms after a 404 ms one, median 290 ms)
    last_end = None
    try:
        for i in range(job.start, args.steps):
            if fault and fault[:2] == (rank, i):
                _planted(fault, rank, i)
            x, y = (batches.rows(i, *share["rows"]) if share else
                    batches.local(i, prog.dp_rank, getattr(prog, "dp_only", prog.dp)))
            if getattr(prog, "cp", 1) > 1:          # context parallelism: this rank's tokens of them
                x, y = prog.shard_tokens(x, y)
            if pace:
                time.sleep(pace)
            t0 = time.perf_counter()
            loss = prog.step(x, y)
            end = time.perf_counter()
            times.append(end - (t0 if last_end is None else last_end))
            last_end = end
            losses.append(loss)
            log.step(i, loss, times[-1])
            done = i + 1
            if args.checkpoint_dir and (done == args.steps or (args.checkpoint_every and done % args.checkpoint_every == 0)):
                path = ckpt.save(prog, done, dict(meta, data_position=batches.position(done), losses=losses))
                last_end = None      # the save is not a training step's time
                if rank == 0 and log.quiet is False:
                    print(f"sapp run: checkpoint {path}", flush=True)
    except SappError as e:
        _say(rank, e)
        log_error(args.log_json, rank, len(losses), str(e))
        os._exit(2)
    except Exception as e:  # this rank's own error, or a peer's seen in a collective: one line each
        _failed(args, rank, losses, e)
    return losses, times


def _planted(fault, rank, i):
    """SAPP_FAULT's action at its step: kill, raise, or exit(1)."""
    print(f"[rank {rank}] SAPP_FAULT: {'killing itself' if fault[2] == 'kill' else 'exiting'} at step {i} "
          f"at t={time.time():.3f}", file=sys.stderr, flush=True)
    if fault[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault[2] == "raise":
        _planted_fault(i)
    os._exit(1)


def _failed(args, rank, losses, e):
    """A rank's error in the step loop, one line (its frames once, where it is the first failure),
    then exit(1)."""
    from . import failure
    from .train_log import log_error
    first, culprit = failure.record(rank, len(losses), e)
    msg = str(e).strip().splitlines()
    head = f"[rank {rank}] error at step {len(losses)}: "
    if first and os.environ.get("SAPP_FAIL_DIR"):       # sapp run prints the frames once, at the end
        print(f"{head}{type(e).__name__}: {msg[0] if msg else ''}", file=sys.stderr, flush=True)
    elif first:
        print(f"{head}{type(e).__name__}: {msg[0] if msg else ''}\n{failure.frames(e)}", file=sys.stderr, flush=True)
    elif culprit is not None and culprit != rank:
        print(f"{head}stopped because rank {culprit} failed", file=sys.stderr, flush=True)
    else:
        print(f"{head}{type(e).__name__}: {msg[0] if msg else ''} (a collective failed: another rank "
              f"died or stalled)", file=sys.stderr, flush=True)
    log_error(args.log_json, rank, len(losses), f"{type(e).__name__}: {msg[0] if msg else ''}")
    os._exit(1)


def _say(rank: int, e) -> None:
    """A rank's one-line error; one every rank raised alike is said once, by rank 0."""
    if rank == 0 or not getattr(e, "every_rank", False):
        print(f"[rank {rank}] error: {e}", file=sys.stderr, flush=True)


def summary(args, plan, world, prog, losses, times, start=0):
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
        from .train_log import peak_memory
        peak, kind = peak_memory(prog.device)
        res = {"model": args.model, "plan": os.path.abspath(args.plan), "devices": world, "parallel": dict(par), "zero": prog.zero, "backend": backend,
               "precision": prog.precision, "peak_memory_bytes": peak, "peak_memory_kind": kind,
               "steps": len(losses), "losses": losses, "start_step": start, "step_times_s": times, "measured_step_time_s": measured,
               "predicted_step_time_s": predicted, "measured_over_predicted": ratio, "notes": prog.notes}
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, sort_keys=True)
