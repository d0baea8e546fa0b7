"""`sapp run plan.json --model NAME`: launch the plan's training program with torchrun, one process per
device (gloo on CPU, nccl with CUDA), and report measured vs predicted step time.

Checks that need no processes (plan file, world size, model name and size) run before the launch; a
rank that dies ends the job (torchrun's agent stops the others, max-restarts 0) with a non-zero exit."""
from __future__ import annotations

import os
import subprocess
import sys

from ..errors import PlanError
from ._model import add_model_arguments, model_spec

PASS_THROUGH = ("nnodes", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "master_addr", "master_port",
                "max_restarts", "monitor_interval")


def add_arguments(p):
    p.add_argument("plan", help="plan JSON from `sapp search`")
    add_model_arguments(p)
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="model setting override, e.g. dropout=0 (repeatable)")
    p.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    p.add_argument("--data", help="torch.save'd (inputs, targets) with a leading sample axis (default: synthetic)")
    p.add_argument("--out", help="write measured step times and losses as JSON here")
    p.add_argument("--nproc", type=int, help="processes on this node (default: the plan's devices / nnodes)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--optimizer", default="adam", choices=("adam", "adamw", "sgd"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=20.0,
                   help="seconds a collective may wait before the job is failed (default 20)")
    g = p.add_argument_group("torchrun options (passed through)")
    g.add_argument("--nnodes")
    g.add_argument("--node-rank", dest="node_rank")
    g.add_argument("--rdzv-backend", dest="rdzv_backend")
    g.add_argument("--rdzv-endpoint", dest="rdzv_endpoint")
    g.add_argument("--rdzv-id", dest="rdzv_id")
    g.add_argument("--master-addr", dest="master_addr")
    g.add_argument("--master-port", dest="master_port")
    g.add_argument("--max-restarts", dest="max_restarts", default="0")
    g.add_argument("--monitor-interval", dest="monitor_interval", default="0.1")


def _nodes(args) -> int:
    if not args.nnodes:
        return 1
    try:
        return int(str(args.nnodes).split(":")[-1])
    except ValueError:
        raise PlanError(f"--nnodes {args.nnodes!r} is not a number or MIN:MAX range") from None


def precheck(args):
    """Refuse before launching: bad plan file, wrong process count, unknown or different model."""
    import sapp.models as models  # not `from .. import`: sapp.__getattr__ recurses on it
    from ..emit import checks
    from ..plan import Plan
    from ..emit.worker import model_overrides
    plan = Plan.load(args.plan)
    nodes = _nodes(args)
    nproc = args.nproc or (plan.devices // nodes if plan.devices % nodes == 0 else None)
    if nproc is None or nproc * nodes != plan.devices:
        raise PlanError(f"plan is for {plan.devices} devices but --nproc {nproc} x --nnodes {nodes} gives "
                        f"{(nproc or 0) * nodes}; use --nproc {plan.devices // nodes if plan.devices % nodes == 0 else plan.devices}")
    args.model, args.hf_config = model_spec(args), None     # one spec string, passed on to every rank
    meta = models.build(args.model, device="meta", **model_overrides(args.model_arg))
    checks.check_model(meta, plan, args.model)      # name, size and (capture on meta) fingerprint
    checks.check_pipeline(plan)
    checks.check_names(meta, plan)
    checks.check_pipeline_split(meta, plan)        # trace the split once here, not on the ranks
    if not plan.model.get("global_batch"):
        raise PlanError("plan has no model.global_batch; search it with a global batch")
    return plan, nproc


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
    for kv in args.model_arg:
        cmd += ["--model-arg", kv]
    if args.data:
        cmd += ["--data", args.data]
    if args.out:
        cmd += ["--out", args.out]
    return cmd


def run(args):
    plan, nproc = precheck(args)
    cmd = command(args, nproc)
    print(f"sapp run: launching {nproc} process(es) per node: {' '.join(cmd[1:])}", flush=True)
    env = dict(os.environ, SAPP_RUN_PRECHECKED="1")
    rc = subprocess.call(cmd, env=env)
    if rc != 0:
        print(f"sapp run: error: training failed (exit code {rc}): a rank died or raised; its message is above",
              file=sys.stderr, flush=True)
        return rc if rc > 0 else 1
    return 0
