"""`sapp export PLAN --to megatron|torchtitan|torchtitan@0.2.2|deepspeed [--out FILE]`: a plan as the engine's own
configuration (sapp/engines).  What the engine cannot state is refused in one line, or exported as the
nearest configuration it runs with a NOTE, re-priced as exported."""
from __future__ import annotations

import sys

from ._engines import engine_help, engine_names
from ..units import fmt_time
from ._model import add_model_arguments, model_spec


def add_arguments(p):
    p.add_argument("plan", help="plan JSON file (from `sapp search`)")
    p.add_argument("--to", required=True, choices=engine_names(),
                   help=engine_help("engine: "))
    p.add_argument("--out", help="write the configuration here (default: print it)")
    p.add_argument("--plan-out", metavar="PLAN_JSON",
                   help="also write the plan as exported (re-priced when the engine runs something else)")
    add_model_arguments(p, default_help=" (re-pricing a conformed export captures it; default: the plan's model "
                                        "when it is a zoo name or a config.json)")
    p.add_argument("--trust-plan-model", dest="trust_plan_model", action="store_true",
                   help="import and call the plan's pkg.module:factory model (never done by default: a plan is data)")


def _estimate_note(text, exported):
    """Megatron-LM prints its own memory estimate at startup; say so where it reads as not fitting."""
    from ..cluster import Cluster
    from ..engines.estimate_fit import file_estimate_bytes
    from ..units import fmt_bytes
    cl = Cluster.from_dict(exported["cluster"], where="plan's cluster section: ")
    est = file_estimate_bytes(text, cl.devices)
    if est > cl.usable_memory:
        print(f"NOTE: Megatron-LM's startup memory estimate for this file is {fmt_bytes(est)} per GPU, over the "
              f"{fmt_bytes(cl.usable_memory)} usable; its formula leaves out context parallelism, full recomputation "
              f"and bf16 main_grads, and sapp prices the job at {fmt_bytes(exported['predicted']['peak_memory_bytes'])}. "
              f"`sapp search --target megatron --fit-engine-estimate` finds plans its estimate also fits", file=sys.stderr)


def mixed_refusal(path, doc, engine) -> str:
    """Why a mixed-cluster plan has no engine configuration, and what runs it instead."""
    from ..plan.mixed import members, mode
    how = "an uneven batch split" if mode(doc) == "data" else "pipeline stages"
    first = members(doc)[0]["name"]
    return (f"{path} is a mixed-cluster plan ({how} over {' + '.join(g['name'] for g in members(doc))}): {engine} runs "
            f"one device kind with one layout on every rank, which this plan is not; run it with `sapp run {path}`, or "
            f"export a plan searched for one group's cluster (`sapp search --cluster {first}:nodes=N --target {engine}`)")


def run(args):
    from ..engines import export_plan
    from ..errors import UsageError
    from ..plan import load_any
    from ._paths import check_out
    for path, flag in ((args.out, "--out"), (args.plan_out, "--plan-out")):
        if path:
            check_out(path, flag)
    kind, plan = load_any(args.plan)
    if kind == "mixed":
        raise UsageError(mixed_refusal(args.plan, plan, args.to))
    model = model_spec(args) if (args.model or args.hf_config) else None
    text, exported, notes = export_plan(plan, args.to, model=model, trust_plan_model=args.trust_plan_model)
    for n in notes:
        print(f"NOTE: {n}", file=sys.stderr)
    if notes:
        print(f"NOTE: re-priced as exported: {fmt_time(exported['predicted']['step_time_s'])}/step "
              f"(the plan said {fmt_time(plan['predicted']['step_time_s'])})", file=sys.stderr)
    if args.to == "megatron":
        _estimate_note(text, exported)
    if args.plan_out:
        exported.save(args.plan_out)
    if args.out:
        from ..fileio import write_atomic
        try:        # never through a symlink
            write_atomic(args.out, text)
        except OSError as e:
            raise UsageError(f"cannot write --out {args.out}: {e.strerror or e}") from None
        print(f"{args.to} configuration written to {args.out}")
    else:
        print(text, end="")
    return 0
