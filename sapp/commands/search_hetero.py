"""`sapp search --cluster A+B`: the plan over a mixed cluster (sapp/search/hetero.py)."""
from __future__ import annotations


def run_hetero(args, spec, mc, constraints):
    from sapp.api import mixed as hetero_plan
    from ..errors import UsageError
    if getattr(args, "target", None):
        raise UsageError("--target exports a one-kind plan; a mixed cluster's plan is sapp's own (drop --target)")
    mode = getattr(args, "mixed_mode", None) or "auto"
    doc, timing = hetero_plan.search(spec, mc, global_batch=args.batch, constraints=constraints,
                                     precision=args.precision, runtime=args.runtime, mode=mode)
    from ..plan.mixed import mode as mode_of
    print(hetero_plan.explain(doc), end="")
    if mode == "auto" and mode_of(doc) == "data":
        why, t, above = timing.get("pipeline_why"), timing.get("pipeline_step_s"), timing.get("pipeline_step_above_s")
        print("  pipeline mode (stages on the groups): " + (
            f"{t:.4g} s" if t is not None else f"> {above:.4g} s (pruned: no configuration's lower bound beats the "
            "data mode)" if above is not None else f"not searched: {why}"))
    if mode_of(doc) == "pipeline":
        print(f"  search {timing['search_s']:.3g} s ({timing['evaluations']} pipeline configurations)")
    else:
        print(f"  search {timing['search_s']:.3g} s ({timing['evaluations']} group searches)")
    if args.out:
        from ..plan import Plan
        Plan(doc).save(args.out)      # (the bytes hetero_plan.dumps writes; never through a symlink)
        print(f"wrote {args.out}")
    return 0

