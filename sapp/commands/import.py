"""`sapp import --from megatron ARGS | torchtitan PY [--job NAME] | torchtitan@0.2.2 TOML | deepspeed JSON
--model M --cluster C --out plan.json`:
an engine configuration as a sapp plan, priced with that engine's runtime profile, and (unless
--no-compare) sapp's best plan for the same engine beside it in one line.  A Megatron-LM argument file
states the whole model: without --model it is priced as the model it states (sapp/engines/megatron_build.py)."""
from __future__ import annotations

from ._engines import engine_help, engine_names
from ..errors import UsageError
from ..units import fmt_bytes, fmt_time
from ._model import add_model_arguments, model_spec

MAX_BYTES = 4 << 20          # an engine configuration is a few kB


def add_arguments(p):
    p.add_argument("--from", dest="engine", required=True,
                   choices=engine_names(),
                   help=engine_help("the engine the configuration is for: "))
    p.add_argument("config", help="the engine's configuration: Megatron-LM argument file, torchtitan 0.3 Python job "
                                  "(read with ast), torchtitan@0.2.2 TOML or DeepSpeed JSON (read as data, never "
                                  "executed)")
    p.add_argument("--job", metavar="NAME",
                   help="the job function to read from a torchtitan 0.3 file of several (torchtitan's --config; e.g. "
                        "llama3_8b of models/llama3/config_registry.py as published): without it, a file of one is "
                        "read and a file of several is refused with their names")
    add_model_arguments(p, default_help=" (--from megatron without it: the model the argument file states)")
    p.add_argument("--cluster", required=True, help="the cluster it runs on, e.g. a100-80g:nodes=128, or a JSON file")
    p.add_argument("--out", help="write the imported plan JSON here")
    p.add_argument("--best-out", metavar="PLAN_JSON", help="write sapp's best plan for the same engine here")
    p.add_argument("--full", action="store_true",
                   help="write the operators map inside the plan files (default: beside it, PLAN.operators.json, "
                        "so the plan stays short enough to read; every command reads the pair as one plan)")
    p.add_argument("--no-compare", action="store_true", help="only price the configuration (no search)")


def read_text(path) -> str:
    from ..fileio import read_text as read       # non-blocking open: a FIFO or device is refused, never waited on
    return read(path, MAX_BYTES, what="engine file", give="give the engine's configuration file",
                too_big="not an engine configuration", not_text="give the engine's text configuration", error=UsageError)


def run(args):
    from .. import api
    from ..engines import best_plan, comparison, import_config, target_of
    from ._paths import check_out
    for path, flag in ((args.out, "--out"), (args.best_out, "--best-out")):
        if path:
            check_out(path, flag)
    if args.job is not None and args.engine != "torchtitan":      # before the file and the model are read
        raise UsageError(f"--job picks a job function of a torchtitan 0.3 Python file; --from {args.engine} has none")
    text = read_text(args.config)
    from_file = args.engine == "megatron" and not (args.model or args.hf_config)
    spec = None if from_file else model_spec(args)
    cl = api.resolve_cluster(args.cluster)
    if from_file:               # the model the flags state, built from them as data
        from ..engines.megatron_build import build
        module, name = build(text, args.config), args.config
    else:
        module, name, _ = api.resolve_model(spec)
    graph, _ = api.capture_graph(module)
    plan = import_config(text, args.engine, graph, cl, name, source=args.config, job=args.job)
    if args.out:
        plan.save(args.out, operators_beside=not args.full)
    pr = plan["predicted"]
    fits = pr["peak_memory_bytes"] <= cl.usable_memory
    print(f"your configuration  {fmt_time(pr['step_time_s'])}/step  MFU {pr['mfu']:.1%}  peak "
          f"{fmt_bytes(pr['peak_memory_bytes'])} of {fmt_bytes(cl.usable_memory)} usable"
          f"{'' if fits else '  DOES NOT FIT'}  ({plan['settings']['runtime']} runtime)")
    for n in plan["notes"]:
        print(f"  - {n}")
    if args.out:
        from ._paths import written_beside
        print(f"plan written to {args.out}" + written_beside(args))
    if args.no_compare:
        return 0 if fits else 1
    st = plan["settings"]
    from ..report.progress import LOG_EVERY, Progress
    # the comparison searches the engine's whole space (a minute for GPT-3 175B): a bar, or lines in a log
    with Progress(label="import", counts=False, log_every=LOG_EVERY) as prog:
        prog.status(f"comparing: searching the best plan {args.engine} can state on {cl.name}")
        best = best_plan(graph, cl, target_of(args.engine, st["runtime"]), global_batch=plan["model"]["global_batch"],
                     model=module, progress=prog.ticking(),
                     settings={"runtime": st["runtime"], "precision": st["precision"], "optimizer": st.get("optimizer"),
                               "grad_fp32": st.get("grad_fp32", False),
                               "fp8": st.get("fp8") or None})   # as the engine would run it
    print(comparison(plan, best))
    if args.best_out:
        best.save(args.best_out, operators_beside=not args.full)
        print(f"best plan written to {args.best_out}  (compare: sapp diff {args.out or 'yours.json'} {args.best_out})")
    return 0 if fits else 1
