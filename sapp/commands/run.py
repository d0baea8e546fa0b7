"""`sapp run plan.json --model NAME`: launch the plan's training program with torchrun, one process per
device (gloo on CPU, nccl with CUDA), and report measured vs predicted step time.

Checks that need no processes (plan file, world size, model name and size, data source, checkpoint
directory) run before the launch; a rank that dies ends the job (torchrun's agent stops the others,
max-restarts 0) with a non-zero exit, or with --max-restarts N and --checkpoint-dir, restarts every
worker from the last checkpoint.  --resume continues a run, under this plan or any other."""
from __future__ import annotations

import os
import subprocess
import sys

from ..errors import PlanError, SappError, UsageError
from ._model import add_model_arguments, model_spec

PASS_THROUGH = ("nnodes", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "master_addr", "master_port",
                "max_restarts", "monitor_interval")


def add_arguments(p):
    p.add_argument("plan", help="plan JSON from `sapp search`")
    add_model_arguments(p)
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="model setting override, e.g. dropout=0 (repeatable)")
    p.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    p.add_argument("--data", help="torch.save'd (inputs, targets) with a leading sample axis, or pkg.module:factory "
                   "returning a map-style dataset or an iterable of (inputs, target) (default: synthetic)")
    p.add_argument("--shuffle", action="store_true", help="map-style data: a fresh seeded permutation every epoch")
    p.add_argument("--out", help="write measured step times and losses as JSON here")
    p.add_argument("--nproc", type=int, help="processes on this node (default: the plan's devices / nnodes)")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    p.add_argument("--optimizer", default="adam", choices=("adam", "adamw", "sgd"), help="optimizer (default adam)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the initial weights and of --shuffle's order (default 0)")
    p.add_argument("--timeout", type=float, default=20.0,
                   help="seconds a collective may wait before the job is failed (default 20)")
    p.add_argument("--log-json", dest="log_json",
                   help="every rank appends one JSON line per step (loss, step time, samples/s, peak memory) and its "
                        "error if it fails: rank 0 to this file, rank r to it with .rank<r> before the extension")
    c = p.add_argument_group("checkpoints (torch.distributed.checkpoint; any plan resumes any checkpoint)")
    c.add_argument("--checkpoint-dir", dest="checkpoint_dir", help="save here (shared by all nodes)")
    c.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, default=0,
                   help="save every N steps (and always after the last)")
    c.add_argument("--keep", type=int, default=2, help="committed checkpoints kept (default 2)")
    c.add_argument("--resume", nargs="?", const="latest", metavar="CHECKPOINT",
                   help="continue from the newest intact checkpoint in --checkpoint-dir, or from CHECKPOINT")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="run even where the emitted program differs from the plan (a loud note and a re-priced prediction)")
    g = p.add_argument_group("torchrun options (passed through)")
    g.add_argument("--nnodes", help="nodes in the job: N or MIN:MAX (default 1)")
    g.add_argument("--node-rank", dest="node_rank", help="this node's rank, 0 .. nnodes-1")
    g.add_argument("--rdzv-backend", dest="rdzv_backend", help="rendezvous backend, e.g. c10d")
    g.add_argument("--rdzv-endpoint", dest="rdzv_endpoint", help="rendezvous HOST:PORT (node 0's address)")
    g.add_argument("--rdzv-id", dest="rdzv_id", help="job id shared by every node's command")
    g.add_argument("--master-addr", dest="master_addr", help="static rendezvous: node 0's address")
    g.add_argument("--master-port", dest="master_port", help="static rendezvous: node 0's port")
    g.add_argument("--max-restarts", dest="max_restarts", default="0",
                   help="restart all workers up to N times after a failure (from the last checkpoint with --checkpoint-dir)")
    g.add_argument("--monitor-interval", dest="monitor_interval", default="0.1",
                   help="seconds between the launcher's checks on its workers (default 0.1)")


def _nodes(args) -> int:
    if args.nnodes is None:
        return 1
    parts = str(args.nnodes).split(":")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise UsageError(f"--nnodes {args.nnodes!r} is not a number or MIN:MAX range") from None
    if len(nums) > 2 or any(n < 1 for n in nums) or nums[0] > nums[-1]:
        raise UsageError(f"--nnodes {args.nnodes!r} must be a positive number N or a range MIN:MAX with 1 <= MIN <= MAX")
    return nums[-1]


def _check_numbers(args):
    import math
    if args.nproc is not None and args.nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {args.nproc}")
    if args.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise UsageError(f"--lr must be a positive finite number, got {args.lr}")


def _model_args(name, pairs) -> dict:
    """--model-arg KEY=VALUE overrides checked against the zoo model's own settings: the key must be
    one of them and the value of the same kind (a number for a number), so the worker never builds a
    model from `dropout=abc`."""
    import math
    import sapp.models as models
    from ..emit.worker import model_overrides
    for kv in pairs:
        if "=" not in kv:
            raise UsageError(f"--model-arg {kv!r} needs KEY=VALUE, e.g. dropout=0")
    out = model_overrides(pairs)
    if name not in models.names():          # a factory / HF config takes its own keywords
        return out
    config = models.info(name).get("config") or {}
    for k, v in out.items():
        if k not in config:
            raise UsageError(f"--model-arg {k}: {name} has no setting {k!r}; it has {', '.join(sorted(config))}")
        default = config[k]
        ok = (isinstance(v, bool) if isinstance(default, bool) else
              isinstance(v, int) and not isinstance(v, bool) if isinstance(default, int) else
              isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) if isinstance(default, float) else
              isinstance(v, list) if isinstance(default, (list, tuple)) else
              isinstance(v, str) if isinstance(default, str) else True)
        if not ok:
            raise UsageError(f"--model-arg {k}={v!r}: {name}'s {k} is a {type(default).__name__} like {default!r}")
    return out


def precheck(args):
    """Refuse before launching: bad plan file, wrong process count, unknown or different model."""
    import sapp.models as models  # not `from .. import`: sapp.__getattr__ recurses on it
    from ..emit import checks
    from ..plan import Plan
    from ._paths import check_out
    _check_numbers(args)
    nodes = _nodes(args)
    if args.out:
        check_out(args.out)
    plan = Plan.load(args.plan)
    nproc = args.nproc or (plan.devices // nodes if plan.devices % nodes == 0 else None)
    if nproc is None or nproc * nodes != plan.devices:
        raise PlanError(f"plan is for {plan.devices} devices but --nproc {nproc} x --nnodes {nodes} gives "
                        f"{(nproc or 0) * nodes}; use --nproc {plan.devices // nodes if plan.devices % nodes == 0 else plan.devices}")
    args.model, args.hf_config = model_spec(args), None     # one spec string, passed on to every rank
    overrides = _model_args(args.model, args.model_arg)
    try:
        meta = models.build(args.model, device="meta", **overrides)       # zoo | pkg.module:factory | HF config
    except (TypeError, ValueError, ArithmeticError) as e:     # an in-range override the model still refuses
        raise UsageError(f"--model-arg: {args.model} cannot be built with {overrides}: {str(e)[:120]}") from None
    checks.check_model(meta, plan, args.model)      # name, size and (capture on meta) fingerprint
    checks.check_pipeline(plan)
    checks.check_names(meta, plan)
    checks.check_pipeline_split(meta, plan)        # trace the split once here, not on the ranks
    if not plan.model.get("global_batch"):
        raise PlanError("plan has no model.global_batch; search it with a global batch")
    precheck_training(args, plan)
    return plan, nproc


def precheck_training(args, plan):
    """Data source, checkpoint directory (writable, room for one checkpoint) and resume target."""
    from ..emit import checkpoint, data
    if args.data and data.is_factory(args.data) and not os.path.exists(args.data):
        data.resolve_factory(args.data)
    elif args.data and not os.path.isfile(args.data):
        raise data.DataError(f"data file {args.data} not found; pass a torch.save'd file or pkg.module:factory")
    if getattr(args, "keep", 1) < 1:
        raise SappError(f"--keep {args.keep} would delete every checkpoint; keep at least 1")
    if getattr(args, "resume", None) == "latest" and not args.checkpoint_dir:
        raise SappError("--resume without a checkpoint path needs --checkpoint-dir (where to look)")
    if getattr(args, "resume", None) not in (None, "latest"):
        _, why = checkpoint.verify(args.resume)
        if why:
            raise SappError(f"cannot resume from {args.resume}: {why}; pass another checkpoint to --resume")
    if getattr(args, "checkpoint_dir", None):
        checkpoint.check_directory(args.checkpoint_dir,
                                   checkpoint.estimate_bytes(int(plan.model.get("params") or 0), args.optimizer),
                                   resuming=bool(args.resume))


def command(args, nproc: int) -> list:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if not args.nnodes and not args.rdzv_endpoint:
        cmd.append("--standalone")
    for key in PASS_THROUGH:
        v = getattr(args, key, None)
        if v is not None:
            cmd.append(f"--{key.replace('_', '-')}={v}")
    cmd += ["-m", "sapp.emit.worker", args.plan, "--model", args.model, "--steps", str(args.steps),
            "--lr", str(args.lr), "--optimizer", args.optimizer, "--seed", str(args.seed), "--timeout", str(args.timeout)]
    if getattr(args, "allow_mismatch", False):
        cmd.append("--allow-mismatch")
    for kv in args.model_arg:
        cmd += ["--model-arg", kv]
    for flag in ("data", "out", "log_json", "checkpoint_dir", "resume"):
        if getattr(args, flag, None):
            cmd += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    if getattr(args, "shuffle", False):
        cmd.append("--shuffle")
    if getattr(args, "checkpoint_dir", None):
        cmd += ["--checkpoint-every", str(args.checkpoint_every), "--keep", str(args.keep)]
    return cmd


def run(args):
    plan, nproc = precheck(args)
    cmd = command(args, nproc)
    print(f"sapp run: launching {nproc} process(es) per node: {' '.join(cmd[1:])}", flush=True)
    env = dict(os.environ, SAPP_RUN_PRECHECKED="1")
    # torchrun's c10d rendezvous shares its TCPStore with the workers' init_process_group; after an
    # elastic restart the new workers can read the dead attempt's gloo/NCCL addresses from it and fail
    # to connect (pytorch/pytorch#135712; seen here as "Gloo connectFullMesh failed ... Connection
    # refused" in 1 of 2 restarts).  A store per attempt, hosted by worker rank 0, avoids that.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    rc = subprocess.call(cmd, env=env)
    if rc != 0:
        print(f"sapp run: error: training failed (exit code {rc}): a rank died or raised; its message is above",
              file=sys.stderr, flush=True)
        return rc if rc > 0 else 1
    return 0
