"""`sapp run plan.json --model NAME`: launch the plan's training program with torchrun, one process per
device (gloo on CPU, nccl with CUDA), and report measured vs predicted step time.

Checks that need no processes (plan file, world size, model name and size, data source, checkpoint
directory) run before the launch; a rank that dies ends the job (torchrun's agent stops the others,
max-restarts 0) with a non-zero exit, or with --max-restarts N and --checkpoint-dir, restarts every
worker from the last checkpoint.  --resume continues a run, under this plan or any other.  A mixed-cluster
plan (a plan with `groups`, sapp/plan/mixed.py) runs its groups' uneven data shares: which group this node runs, by the
device it reports or --group NAME, is settled in sapp/commands/run_hetero.py."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

from ..errors import PlanError, SappError, UsageError
from ._model import add_model_arguments, check_model_args, model_spec, plan_settings

PASS_THROUGH = ("nnodes", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "master_addr", "master_port",
                "max_restarts", "monitor_interval")


def add_arguments(p):
    p.add_argument("plan", help="plan JSON from `sapp search` (a mixed cluster's too)")
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
    c.add_argument("--resume-partial", dest="resume_partial", action="store_true",
                   help="with --resume: load only the entries whose names and shapes match this model (the others "
                   "keep their initial values), also from a run on other data or order")
    p.add_argument("--elastic", action="store_true",
                   help="with --nnodes MIN:MAX and --checkpoint-dir: a group of another size re-plans for the devices it "
                        "has and resumes the last checkpoint under that plan (sapp/emit/runtime/elastic.py)")
    p.add_argument("--group", metavar="NAME",
                   help="mixed-cluster plan, one `sapp run` per node: the group this node runs (default: the group "
                        "planned for the device kind this node reports; refused when the kinds differ)")
    p.add_argument("--verbose", action="store_true",
                   help="print the torchrun command and torch's own launch messages (default: one launch line)")
    p.add_argument("--allow-device-mismatch", action="store_true",
                   help="run a plan priced for GPUs on this machine's CPU processes anyway (its predictions are not "
                        "this machine's); without it such a plan is refused before launching")
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
    g.add_argument("--rdzv-timeout", dest="rdzv_timeout", type=int, default=600,
                   help="multi-node: seconds to wait for every node to join before failing (default 600)")


def _nodes(args) -> int:
    if args.nnodes is None:
        return 1
    if not str(args.nnodes).isascii():      # int() takes '２'; torchrun and the other nodes' commands may not
        raise UsageError(f"--nnodes {args.nnodes!r}: write the node count in ASCII digits 0-9")
    parts = str(args.nnodes).split(":")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise UsageError(f"--nnodes {args.nnodes!r} is not a number or MIN:MAX range") from None
    if len(nums) > 2 or any(n < 1 for n in nums) or nums[0] > nums[-1]:
        raise UsageError(f"--nnodes {args.nnodes!r} must be a positive number N or a range MIN:MAX with 1 <= MIN <= MAX")
    return nums[-1]


def _check_rendezvous(args, nodes: int):
    """Before anything binds: a multi-node job names its rendezvous address, on sapp's c10d backend (the
    static one, torchrun's default, listens unauthenticated on [::]:29500, the address sapp must not bind)."""
    rank = getattr(args, "node_rank", None)
    if rank is not None and not (str(rank).isascii() and str(rank).isdigit() and int(rank) < nodes):
        raise UsageError(f"--node-rank {str(rank)[:40]!r} must be a whole number (ASCII digits) from 0 to {nodes - 1}")
    if getattr(args, "rdzv_timeout", 600) < 1:
        raise UsageError(f"--rdzv-timeout must be at least 1 second, got {args.rdzv_timeout}")
    if nodes > 1 and not getattr(args, "rdzv_endpoint", None):
        raise UsageError(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT, node 0's address as the other nodes "
                         "reach it (sapp listens there only, never on every interface)")
    endpoint = getattr(args, "rdzv_endpoint", None)
    if endpoint and ":" in endpoint:         # (no port: torchrun's 29400)
        host, _, port = endpoint.rpartition(":")
        if not host.strip("[]") or not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            from ..errors import shown
            raise UsageError(f"--rdzv-endpoint {shown(endpoint)}: give HOST:PORT, a port from 1 to 65535 in ASCII digits")
    backend = getattr(args, "rdzv_backend", None)
    if getattr(args, "rdzv_endpoint", None) and backend not in (None, "c10d"):
        raise UsageError(f"--rdzv-backend {str(backend)[:40]!r}: sapp run's rendezvous is c10d, bound to the "
                         "--rdzv-endpoint address only; drop --rdzv-backend")


def _check_numbers(args):
    import math
    if args.nproc is not None and args.nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {args.nproc}")
    if args.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    if not 0 <= args.seed < 2 ** 63:         # torch.manual_seed's range (1e23 failed on every rank)
        raise UsageError(f"--seed must be from 0 to 2**63 - 1, got {args.seed}")
    try:
        restarts = int(getattr(args, "max_restarts", 0) or 0)
    except (TypeError, ValueError):
        raise UsageError(f"--max-restarts must be a whole number, got {getattr(args, 'max_restarts', None)!r}") from None
    if not 0 <= restarts <= 1000:
        raise UsageError(f"--max-restarts must be from 0 to 1000, got {restarts}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise UsageError(f"--lr must be a positive finite number, got {args.lr}")


def check_device(plan, args) -> None:
    """A plan priced for a GPU kind needs that kind here: on a machine without CUDA its ranks would
    train on CPU processes at another speed and memory than priced.  --allow-device-mismatch runs it
    so on purpose (said in one line)."""
    from .run_hetero import kind_of
    import importlib.util
    kind = kind_of(plan["cluster"].get("name")) or kind_of(plan["cluster"].get("notes"))
    if kind in (None, "cpu"):
        return
    has_cuda = False
    # no GPU device node, no GPU: said at once, without importing torch (seconds on a loaded box)
    nodes = any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg"))
    if nodes and importlib.util.find_spec("torch") is not None:
        import torch
        has_cuda = torch.cuda.is_available()
    if has_cuda:
        return
    where = f"the plan is for {plan['devices']} {kind.upper()} devices ({plan['cluster'].get('name')}) but this machine has no GPU"
    if getattr(args, "allow_device_mismatch", False):
        print(f"sapp run: {where}: running it on CPU processes as asked (--allow-device-mismatch); its "
              "predicted times and memory are not this machine's", file=sys.stderr, flush=True)
        return
    raise PlanError(f"{where}; run it where its GPUs are, search a plan for this machine (--cluster cpu), or pass "
                    "--allow-device-mismatch to run it on CPU anyway")


def precheck(args):
    """Refuse before launching: bad plan file, wrong process count, unknown or different model."""
    from ..plan import load_any
    from ._paths import check_out
    _check_numbers(args)
    nodes = _nodes(args)
    _check_rendezvous(args, nodes)
    if args.out:
        check_out(args.out)
    from .run_hetero import mixed_plan
    loaded = load_any(args.plan)              # read and checked once: a 175B plan's schema check takes seconds
    mixed = mixed_plan(args, nodes, single_node(args), loaded=loaded)   # (this node's plan over the job, nproc) or None
    if mixed is None and getattr(args, "group", None):
        raise UsageError(f"--group names a group of a mixed-cluster plan; {args.plan} is a plan for one device kind: "
                         "drop --group")
    plan = mixed[0] if mixed else loaded[1]
    if not mixed:          # a mixed plan's groups were matched to this node's device already
        check_device(plan, args)
    import sapp.models as models  # (after the checks that need no torch) not `from .. import`: sapp.__getattr__ recurses
    from ..emit.checks import plan as checks
    nproc = mixed[1] if mixed else args.nproc or (plan.devices // nodes if plan.devices % nodes == 0 else None)
    if mixed:
        pass        # the node count and processes per group were checked against the plan's groups
    elif getattr(args, "elastic", False) and args.nproc:
        pass        # an elastic job runs on the processes it is given: the workers re-plan for them
    elif nproc is None or nproc * nodes != plan.devices:
        raise PlanError(f"plan is for {plan.devices} devices but --nproc {nproc} x --nnodes {nodes} gives "
                        f"{(nproc or 0) * nodes}; use --nproc {plan.devices // nodes if plan.devices % nodes == 0 else plan.devices}")
    # one spec string, passed on to every rank: the user's, else the zoo model or HF config the plan names
    # (a factory a plan names is code: model_spec asks for --model), built with the settings it was searched with
    args.model_arg = plan_settings(plan, args)
    args.model, args.hf_config = model_spec(args, default=plan["model"].get("name")), None
    overrides = check_model_args(args.model, args.model_arg)
    try:
        meta = models.build(args.model, device="meta", **overrides)       # zoo | pkg.module:factory | HF config
    except (TypeError, ValueError, ArithmeticError) as e:     # an in-range override the model still refuses
        raise UsageError(f"--model-arg: {args.model} cannot be built with {overrides}: {str(e)[:120]}") from None
    checks.check_model(meta, plan, args.model)      # name, size and (capture on meta) fingerprint
    checks.check_pipeline(plan)
    checks.check_names(meta, plan)
    from ..capture.devices import meta_as_training_device
    with meta_as_training_device():                 # model code asking its tensors' device type
        checks.check_pipeline_split(meta, plan)    # trace the split once here, not on the ranks
    if not plan.model.get("global_batch"):
        raise PlanError("plan has no model.global_batch; search it with a global batch")
    precheck_training(args, plan)
    return plan, nproc


def precheck_training(args, plan):
    """Data source, checkpoint directory (writable, room for one checkpoint) and resume target."""
    from ..emit.runtime import checkpoint, data
    if args.data and data.is_factory(args.data) and not os.path.exists(args.data):
        data.resolve_factory(args.data)
    elif args.data and not os.path.isfile(args.data):
        from ..fileio import special_kind
        what = special_kind(args.data) if os.path.exists(args.data) else None
        raise data.DataError(f"data file {args.data} " + (f"is {what}" if what else "not found")
                             + "; pass a torch.save'd file or pkg.module:factory")
    log = getattr(args, "log_json", None)
    if log:      # every rank appends to it (and to .rank<r> beside it): a FIFO would block the rank
        import stat
        from ..emit.runtime.train_log import rank_path
        for path in {log, rank_path(log, 1)}:
            if os.path.lexists(path) and not stat.S_ISREG(os.stat(path).st_mode):
                raise SappError(f"--log-json {path} exists and is not a regular file; give a file path")
    if getattr(args, "keep", 1) < 1:
        raise SappError(f"--keep {args.keep} would delete every checkpoint; keep at least 1")
    if getattr(args, "resume", None) == "latest" and not args.checkpoint_dir:
        raise SappError("--resume without a checkpoint path needs --checkpoint-dir (where to look)")
    resume = getattr(args, "resume", None)
    if resume not in (None, "latest"):
        _, why = checkpoint.verify(args.resume)
        if why:
            raise SappError(f"cannot resume from {args.resume}: {why}; pass another checkpoint to --resume")
    if resume and getattr(args, "checkpoint_dir", None) and os.path.isdir(args.checkpoint_dir):
        # before launching: a resume that would overwrite another run's steps, or that finds only damaged ones
        checkpoint.resume_point(args.checkpoint_dir, None if resume == "latest" else resume, log=lambda _m: None)
    if getattr(args, "elastic", False) and not getattr(args, "checkpoint_dir", None):
        raise SappError("--elastic needs --checkpoint-dir: a group of another size resumes its last checkpoint")
    if getattr(args, "resume_partial", False) and not getattr(args, "resume", None):
        raise SappError("--resume-partial needs --resume (it says how much of a checkpoint to load)")
    if getattr(args, "checkpoint_dir", None):
        elastic = getattr(args, "elastic", False)      # a joining node finds the job's checkpoints and lock
        checkpoint.check_directory(args.checkpoint_dir,
                                   checkpoint.estimate_bytes(int(plan.model.get("params") or 0), args.optimizer),
                                   resuming=bool(args.resume) or elastic,
                                   writes=lambda s, n=args.steps, e=args.checkpoint_every: s == n or bool(e and s <= n
                                                                                                 and s % e == 0))
        if not elastic and (not args.nnodes or str(getattr(args, "node_rank", None) or "0") == "0"):   # one job per directory
            checkpoint.lock(args.checkpoint_dir, hold=False)


def single_node(args) -> bool:
    """No --rdzv-endpoint and one node (`--nnodes 1` too: it ran torchrun's static rendezvous on [::]:29500)."""
    return not getattr(args, "rdzv_endpoint", None) and _nodes(args) == 1


def command(args, nproc: int) -> list:
    """torchrun through sapp/emit/runtime/launch.py: every store listens on one address, 127.0.0.1 for a
    single-node run (torchrun's --standalone would listen on all interfaces), the --rdzv-endpoint
    address for the rendezvous of a multi-node run and this node's address toward it for rank 0's."""
    import uuid
    from ..emit.runtime.launch import BACKEND
    cmd = [sys.executable, "-m", "sapp.emit.runtime.launch", f"--nproc-per-node={nproc}"]
    given = {key: getattr(args, key, None) for key in PASS_THROUGH}
    if single_node(args):
        given.update(nnodes="1", rdzv_backend=BACKEND, rdzv_endpoint="127.0.0.1:0", rdzv_id=str(uuid.uuid4()))
        cmd.append("--local-addr=127.0.0.1")
    elif given.get("rdzv_endpoint") and given.get("rdzv_backend") in (None, "c10d"):
        given["rdzv_backend"] = BACKEND
        cmd += [f"--local-addr={local_address(given['rdzv_endpoint'])}",
                f"--rdzv-conf=join_timeout={args.rdzv_timeout}"]
    for key in PASS_THROUGH:
        v = given.get(key)
        if v is not None:
            cmd.append(f"--{key.replace('_', '-')}={v}")
    cmd += ["-m", "sapp.commands.run_worker", args.plan, "--model", args.model, "--steps", str(args.steps),
            "--lr", str(args.lr), "--optimizer", args.optimizer, "--seed", str(args.seed), "--timeout", str(args.timeout)]
    if getattr(args, "allow_mismatch", False):
        cmd.append("--allow-mismatch")
    if getattr(args, "hetero_group", None):
        cmd += ["--group", args.hetero_group]
    if getattr(args, "elastic", False):
        cmd.append("--elastic")
    for kv in args.model_arg:
        cmd += ["--model-arg", kv]
    for flag in ("data", "out", "log_json", "checkpoint_dir", "resume"):
        if getattr(args, flag, None):
            cmd += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    if getattr(args, "shuffle", False):
        cmd.append("--shuffle")
    if getattr(args, "resume_partial", False):
        cmd.append("--resume-partial")
    if getattr(args, "checkpoint_dir", None):
        cmd += ["--checkpoint-every", str(args.checkpoint_every), "--keep", str(args.keep)]
    return cmd


def local_address(endpoint: str) -> str:
    """This machine's address on the route to the rendezvous endpoint (what the other nodes reach it
    by): a UDP socket connected there, no packet sent."""
    host, _, port = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", "")
    host = host.strip("[]") or endpoint
    try:
        family = socket.getaddrinfo(host, None)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, int(port or 29400)))
            return s.getsockname()[0]
    except (OSError, ValueError, OverflowError):
        raise UsageError(f"--rdzv-endpoint {endpoint[:80]}: cannot find this machine's address toward it; give HOST:PORT "
                         "of node 0 as the other nodes reach it") from None


def _launch(cmd, env, args):
    """The launcher's exit code, or None when Ctrl-C or SIGTERM stopped the job: the launcher (in this
    process group for Ctrl-C, sent SIGTERM otherwise) stops its workers, and one line says where
    the job stands, with its last checkpoint."""
    import signal
    proc = subprocess.Popen(cmd, env=env)

    def stop(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)
    old = signal.signal(signal.SIGTERM, stop)
    try:
        return proc.wait()
    except KeyboardInterrupt as e:
        how = str(e) or "Ctrl-C"
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        except (subprocess.TimeoutExpired, OSError):
            proc.kill()
            proc.wait()
        print(f"sapp run: stopped by {how}; {_last_checkpoint(args)}", file=sys.stderr, flush=True)
        return None
    finally:
        signal.signal(signal.SIGTERM, old)


def _last_checkpoint(args) -> str:
    d = getattr(args, "checkpoint_dir", None)
    if not d:
        return "no checkpoints were kept (--checkpoint-dir keeps them)"
    from ..emit.runtime.checkpoint_find import committed
    done = committed(d)
    if not done:
        return f"no checkpoint was committed in {d} yet"
    step, path = done[-1]
    return f"the last checkpoint is step {step} ({path}): continue with --resume"


def run(args):
    plan, nproc = precheck(args)
    cmd = command(args, nproc)
    print(f"sapp run: launching {nproc} process(es) per node" + (f": {' '.join(cmd[1:])}" if args.verbose else
                                                                 " (--verbose shows the torchrun command)"), flush=True)
    from ..emit.runtime.lifeline import child_env
    env = child_env(dict(os.environ, SAPP_RUN_PRECHECKED="1"))     # the launcher dies with this process
    # torchrun's c10d rendezvous shares its TCPStore with the workers' init_process_group; after an
    # elastic restart the new workers can read the dead attempt's gloo/NCCL addresses from it and fail
    # to connect (pytorch/pytorch#135712; seen here as "Gloo connectFullMesh failed ... Connection
    # refused" in 1 of 2 restarts).  A store per attempt, hosted by worker rank 0, avoids that.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    env.update(SAPP_BIND_STORE="1", SAPP_NODE_RANK=str(args.node_rank or 0))
    if single_node(args):      # the ranks' own gloo / NCCL sockets on loopback too (unless the user chose)
        lo = next((n for _, n in socket.if_nameindex() if n.startswith("lo")), None)
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if lo:
                env.setdefault(var, lo)
    import tempfile
    from ..emit.runtime import failure
    from ..emit.runtime.launch import FAILED_EXIT, TIMEOUT_EXIT
    with tempfile.TemporaryDirectory(prefix="sapp-fail-") as fail_dir:
        # ranks record their errors here; the first failing rank's frames are printed once, below
        env["SAPP_FAIL_DIR"] = fail_dir
        if not args.verbose:
            if nproc > 1:                        # what torchrun sets anyway, without its banner saying so
                env.setdefault("OMP_NUM_THREADS", "1")
            env.setdefault("TORCH_LOGS", "-distributed")  # torch's agent: no warning per worker it stops
        rc = _launch(cmd, env, args)
        if rc is None:                             # stopped by the user: said in one line
            return 130
        if rc in (FAILED_EXIT, TIMEOUT_EXIT):      # the launcher said it in one line
            return rc
        lines = failure.report(fail_dir) if rc != 0 else []
    if rc != 0:
        if lines:
            print(f"sapp run: error: training failed (exit code {rc}): {lines[0]}", file=sys.stderr, flush=True)
            for line in lines[1:]:
                print(f"sapp run: {line}", file=sys.stderr, flush=True)
        else:
            print(f"sapp run: error: training failed (exit code {rc}): no rank raised an exception (one exited or "
                  f"was killed: see the launcher's report above)", file=sys.stderr, flush=True)
        return rc if rc > 0 else 1
    return 0
