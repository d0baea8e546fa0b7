"""`sapp search --model NAME --cluster SPEC`: find a plan, print a summary, optionally save it."""
from __future__ import annotations

import time

from ._engines import engine_help, engine_names
from ..units import fmt_bytes, fmt_count, fmt_time
from ._model import add_model_arguments, add_setting_arguments, model_settings, model_spec, seq_source
from ._paths import written_beside


def add_constraint_arguments(p):
    g = p.add_argument_group("constraints (pin any of them; pin all to score an expert configuration)")
    g.add_argument("--tp", type=int, help="tensor-parallel degree (inside a node)")
    g.add_argument("--dp", type=int, help="data-parallel degree")
    g.add_argument("--pp", type=int, help="pipeline stages")
    g.add_argument("--micro-batches", type=int, help="micro-batches per step")
    from ..search.constraints import SCHEDULES
    g.add_argument("--schedule", choices=SCHEDULES, help="pipeline schedule")
    g.add_argument("--virtual-chunks", type=int, help="chunks per device for the interleaved schedule")
    g.add_argument("--recompute", choices=("none", "selective", "full"), help="recomputation for every block")
    g.add_argument("--recompute-block", action="append", default=[], metavar="PATTERN=POLICY",
                   help="recomputation of the blocks matching PATTERN (a block name, its prefix or a glob; repeat "
                        "for several), the rest as --recompute or searched: e.g. --recompute-block 'h.0=full' "
                        "--recompute-block 'h.1*=selective' (the API's constraints recompute={pattern: policy})")
    g.add_argument("--split-before", metavar="BLOCK,BLOCK,...",
                   help="stage boundaries: the first block of every stage after the first, in order, as the "
                        "plan's split_before names them; pp is their count + 1: e.g. --split-before 'h.12,h.24' "
                        "for 3 stages of GPT's h.0..35 (the API's constraints stages={block: stage})")
    g.add_argument("--place", action="append", default=[], metavar="PATTERN=host|device",
                   help="where a sparse embedding table's weights, gradients and optimizer state live (PATTERN: a "
                        "parameter or module name or glob; repeat for several): e.g. --place 'deep_emb.*=host' on "
                        "wide-deep-100m (the API's constraints placement={pattern: place})")
    g.add_argument("--optimizer-on", choices=("host", "device"),
                   help="where the dense parameters' optimizer state lives and steps: host offloads it as "
                        "DeepSpeed's offload_optimizer does, e.g. --optimizer-on host (the API's placement "
                        "{'optimizer': place})")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="ZeRO stage over the dp group")
    g.add_argument("--max-tp", type=int, help="largest tensor-parallel degree to consider")
    g.add_argument("--max-dp", type=int, help="largest data-parallel degree to consider")
    g.add_argument("--cp", type=int, help="context-parallel degree (each sample's sequence split over cp ranks)")
    g.add_argument("--ep", type=int, help="expert-parallel degree for MoE models (EP groups of dp ranks)")
    g.add_argument("--etp", type=int, choices=(0, 1),
                   help="with --ep beside --tp > 1 (--target megatron): 1 keeps each expert whole on the ep x tp ranks "
                        "(Megatron's --expert-tensor-parallel-size 1), 0 splits experts over tp (expert-tp = tp, its default)")
    g.add_argument("--sp", choices=("on", "off"), help="Megatron sequence parallelism inside the tp group")
    g.add_argument("--target", choices=engine_names(),
                   help=engine_help("search only what this engine can state, priced with its runtime (then `sapp export "
                                    "--to` it): "))
    g.add_argument("--fit-engine-estimate", nargs="?", const="main", choices=("main", "core_v0.16.1"),
                   help="with --target megatron: keep only plans whose Megatron-LM startup memory estimate (which "
                        "leaves out context parallelism, full recomputation and bf16 main_grads) also fits; "
                        "the formula of main (default) or of core_v0.16.1 (which does not divide experts by ep)")


def constraints_from_args(args) -> dict:
    keys = ("tp", "dp", "pp", "micro_batches", "schedule", "virtual_chunks", "recompute", "zero", "max_tp", "max_dp", "cp",
            "ep", "etp", "target")
    out = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    if getattr(args, "sp", None) is not None:
        out["sp"] = args.sp == "on"
    blocks = _pairs("--recompute-block", getattr(args, "recompute_block", None), ("none", "selective", "full"))
    if blocks:       # the uniform --recompute is the default the patterns override
        out["recompute"] = {**({"default": args.recompute} if args.recompute else {}), **blocks}
    place = _pairs("--place", getattr(args, "place", None), ("host", "device"))
    if getattr(args, "optimizer_on", None):
        place["optimizer"] = args.optimizer_on
    if place:
        out["placement"] = place
    if getattr(args, "split_before", None):
        out["stages"] = _stages(args.split_before, out.get("pp"))
    return out


def _pairs(flag, values, allowed) -> dict:
    """PATTERN=VALUE flags as {pattern: value}, each checked (one line naming the bad one)."""
    from ..errors import UsageError
    out = {}
    for kv in values or ():
        pat, eq, val = kv.rpartition("=")
        if not eq or not pat.strip():
            raise UsageError(f"{flag} {kv!r:.80} needs PATTERN=VALUE, e.g. {flag} 'h.0={allowed[-1]}'")
        if val.strip() not in allowed:
            raise UsageError(f"{flag} {kv!r:.80}: {val!r:.40} is not one of {', '.join(allowed)}")
        out[pat.strip()] = val.strip()
    return out


def _stages(text, pp) -> dict:
    """--split-before 'h.12,h.24' as the stages constraint {'h.12': 1, 'h.24': 2} (the first stage
    starts at the model's first block, which the constraint fills in)."""
    from ..errors import UsageError
    names = [b.strip() for b in text.split(",") if b.strip()]
    if not names:
        raise UsageError("--split-before needs block names, e.g. --split-before 'h.12,h.24'")
    if len(set(names)) != len(names):
        raise UsageError(f"--split-before names a block twice ({text!r:.80}); name each stage's first block once")
    if pp is not None and pp != len(names) + 1:
        raise UsageError(f"--split-before names {len(names)} boundaries ({len(names) + 1} stages) but --pp is {pp}; "
                         f"drop --pp or give {pp - 1} boundaries")
    return {b: i + 1 for i, b in enumerate(names)}


def add_arguments(p):
    add_model_arguments(p)
    add_setting_arguments(p)
    p.add_argument("--cluster", required=True, help="cluster spec, e.g. a100-80g:nodes=128, or a JSON file")
    p.add_argument("--batch", type=int, help="global batch (samples per step); default: the model's usual one")
    p.add_argument("--out", help="write the plan JSON here")
    p.add_argument("--full", action="store_true",
                   help="write the operators map inside the plan file (default: beside it, PLAN.operators.json, "
                        "so the plan stays short enough to read; every command reads the pair as one plan)")
    p.add_argument("--precision", default=None, choices=("bf16-mixed", "fp16-mixed", "fp32"),
                   help="training precision to price (default: the cluster's, fp32 for cpu)")
    p.add_argument("--runtime", default=None, choices=("eager", "fused", "fused+tp-overlap", "torchtitan", "torchtitan-0.2.2",
                                                        "torchtitan-0.2.2+compile", "torchtitan-2412",
                                                        "torchtitan-2412+compile"),
                   help="runtime profile to price: eager (default: torch eager ops under autocast, what `sapp run` "
                        "executes), fused (Megatron-Core: fused point-wise kernels, bf16 activations) or "
                        "fused+tp-overlap (fused, and tensor-parallel collectives overlapped with their GEMMs "
                        "as --tp-comm-overlap runs them); torchtitan (0.3 as sapp exports it: eager FSDP2, fp32 "
                        "reduction, varlen FlashAttention), torchtitan-0.2.2 (the same with SDPA; +compile: its blocks "
                        "compiled) or "
                        "torchtitan-2412 (0.2.2 on the Dec 2024 stack of its published benchmark; "
                        "torchtitan-2412+compile with its blocks compiled)")
    p.add_argument("--fp8", choices=("tensorwise", "tensorwise-tp", "delayed", "blockwise"),
                   help="FP8 linear layers in the blocks, priced at the cluster's FP8 rate with the casts: tensorwise "
                        "(torchtitan's float8 converter, dynamic scaling), tensorwise-tp (with its float8 tensor-parallel "
                        "all-gathers), delayed (Megatron-LM's Transformer Engine --fp8-recipe delayed) or blockwise "
                        "(--fp8-recipe blockwise, DeepSeek-V3's 1x128 tiles); under delayed and blockwise a MoE's "
                        "expert GEMMs run in FP8 too; e.g. --fp8 tensorwise on h100-80g")
    p.add_argument("--moe-a2a-overlap", action="store_true",
                   help="price Megatron-Core's --overlap-moe-expert-parallel-comm: a MoE's all-to-alls hidden behind the "
                        "paired micro-batch's compute (ep > 1; interleaved at pp > 1; no full recomputation); sapp run "
                        "does not run it: export the plan to Megatron-LM")
    p.add_argument("--delay-wgrad", action="store_true",
                   help="with --moe-a2a-overlap: Megatron-Core's --delay-wgrad-compute (expert weight gradients also "
                        "hide the backward's all-to-all)")
    p.add_argument("--json", action="store_true", help="print the plan JSON instead of the summary")
    p.add_argument("--mixed-mode", choices=("auto", "data", "pipeline"), default="auto",
                   help="a mixed cluster (A+B): data (each group a data-parallel replica with its share of the batch), "
                        "pipeline (pipeline stages on the groups, layers in proportion to each group's speed) or auto "
                        "(default: the faster)")
    p.add_argument("--no-cache", action="store_true",
                   help="capture the model afresh and leave the capture cache alone.  A zoo name or HF config.json "
                        "is otherwise captured once and read back after (the same plan, seconds sooner, no torch "
                        "import): under $SAPP_CACHE_DIR/capture or ~/.cache/sapp/capture, keyed by the model, its "
                        "config and sapp's, torch's and the capture code's versions; SAPP_CACHE_DIR= (empty) turns "
                        "it off for good")
    add_constraint_arguments(p)


def _block_range(blocks) -> str:
    """'h.0..5' for blocks of one list, 'layer1.0..layer2.3' across lists (ResNet's stages)."""
    if not blocks:
        return "-"
    if len(blocks) == 1:
        return blocks[0]
    first, last = blocks[0], blocks[-1]
    same = first.rpartition(".")[0] == last.rpartition(".")[0]
    return f"{first}..{last.rpartition('.')[2] if same else last}"


def _stage_rows(pipe, cap) -> list:
    """One row per pipeline stage (a device's share of the pipeline).  An interleaved plan lists pp·v
    virtual chunks; they are grouped by the stage that runs them (as `sapp explain` does): the stage's
    blocks and chunks, its forward / backward per micro-batch over all its chunks, its device's memory."""
    chunks = sorted(pipe.get("stages") or [], key=lambda s: s["index"])
    if not chunks:
        return []
    per = {}
    for c in chunks:
        per.setdefault(int(c.get("device_stage", c["index"])), []).append(c)
    v = max(len(cs) for cs in per.values())
    lines = []
    if v > 1 and pipe.get("schedule") == "dualpipev":
        n = len(per)
        lines.append(f"{len(chunks)} chunks in a V on {n} stages (stage s holds chunks s and {2 * n - 1} - s: DualPipeV)")
    elif v > 1:
        lines.append(f"{len(chunks)} virtual chunks: {v} per stage on {len(per)} stages (chunk c runs on stage c % {len(per)})")
    lines.append(f"{'stage':>5} {'blocks':>16} {'fwd/mb':>10} {'bwd/mb':>10} {'memory':>10} {'of':>10}")
    keys = sorted(per)
    show = keys if len(keys) <= 8 else keys[:4] + keys[-3:]
    for i, k in enumerate(show):
        if len(keys) > 8 and i == 4:
            lines.append(f"{'...':>5}")
        cs = per[k]
        blocks = [b for c in cs for b in (c.get("blocks") or [])]
        if len(cs) > 1:
            rng = f"{len(blocks)} in {len(cs)} chunks"
        elif len(keys) == 1:
            rng = "whole model"         # the one stage: every block and what runs around them
        else:
            rng = _block_range(blocks)
        pdx = [c.get("predicted", {}) for c in cs]
        fwd, bwd = sum(p.get("fwd_s", 0) for p in pdx), sum(p.get("bwd_s", 0) for p in pdx)
        mem = max(p.get("memory_bytes", 0) for p in pdx)        # each chunk carries its device's total
        lines.append(f"{k:>5} {rng:>16} {fmt_time(fwd):>10} {fmt_time(bwd):>10} {fmt_bytes(mem):>10} {fmt_bytes(cap):>10}")
    return lines


def _memory_lines(d, mem, peak, head) -> list:
    """The per-device memory line (device memory only) and, where a placement keeps model states in
    host memory, a line of its own for them: the plan's memory breakdown counts the states whole.
    The states on the device are the peak less the other parts (the breakdown's figures are stored
    to 6 digits: tens of GB less tens of GB would not give megabytes right)."""
    pl = (d.get("placement") or {}).get("predicted") or {}
    host = float(pl.get("saved_bytes") or 0.0)
    parts = {k: float(v) for k, v in mem.items() if v}
    if host > 0:
        for k in ("params", "grads", "optimizer"):
            parts.pop(k, None)
        parts = {"model states": max(float(peak) - sum(parts.values()), 0.0), **parts}
    out = [f"memory    {head} (" + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in parts.items() if v) + ")"]
    if host > 0:
        out.append(f"host      {fmt_bytes(host)} of model states per device held in host memory "
                   f"(placement {pl.get('option', 'host')})")
    return out


def _cluster_of(d):
    """The plan's cluster, or None where its section does not load (a hand-edited plan: no band said)."""
    from ..cluster import Cluster
    from ..errors import SappError
    try:
        return Cluster.from_dict(d["cluster"])
    except SappError:
        return None


def summary(plan, timing=None, seq_from=None) -> str:
    """The search's report; `seq_from`: where the sequence length came from (said on the first line)."""
    d = plan.to_dict()
    par, pipe, pr = d["parallel"], d["pipeline"], d["predicted"]
    cap = pr.get("capacity_bytes") or d["cluster"].get("device_memory", 0)
    seq = (d["model"].get("meta") or {}).get("seq")
    seq_text = f", sequence {seq:,} tokens" + (f" ({seq_from})" if seq_from else "") if isinstance(seq, int) else ""
    lines = [f"model {d['model']['name']} ({fmt_count(d['model']['params'])} params){seq_text}, global batch "
             f"{d['model']['global_batch']}, {d['devices']} devices ({d['cluster']['name']}, "
             f"{d['cluster']['nodes']} x {d['cluster']['gpus_per_node']})"]
    sched = pipe["schedule"] + (f" v={pipe['virtual_chunks']}" if pipe.get("virtual_chunks", 1) > 1 else "")
    extra = "".join(f" {k}={par[k]}" for k in ("cp", "ep") if par.get(k, 1) > 1) + (" sp" if par.get("sp") else "")
    lines.append(f"parallel  dp={par['dp']} tp={par['tp']} pp={par['pp']}{extra}  micro-batches {pipe['micro_batches']} x "
                 f"{pipe.get('micro_batch_size')}  schedule {sched}  ZeRO-{d['zero']}  recompute {d['recompute']['default']}"
                 + (f" (+{len(d['recompute']['blocks'])} blocks differ)" if d["recompute"]["blocks"] else ""))
    lines += _stage_rows(pipe, cap)
    mem = pr.get("memory", {})
    total = d["cluster"].get("device_memory", cap)
    usable = f" ({fmt_bytes(cap)} usable)" if cap and abs(cap - total) > 1 else ""
    lines += _memory_lines(d, mem, pr["peak_memory_bytes"], f"peak {fmt_bytes(pr['peak_memory_bytes'])} of {fmt_bytes(total)}{usable} per device")
    from sapp.cluster.trust import band_text, calibration_band, uncalibrated_band
    band = calibration_band(d["cluster"].get("notes"))
    exact = "exact fit" in str(d["cluster"].get("notes") or "").rpartition("--from-run")[2]
    trust = (f" (±{band:.0%}, calibrated from measured runs" + ("; other layouts unvalidated" if exact else "") + ")"
             if band is not None else "")
    if band is None and uncalibrated_band(_cluster_of(d)) is not None:
        trust = f" ({band_text()})"
    lines.append(f"predicted step {fmt_time(pr['step_time_s'])}{trust}  MFU {pr['mfu']:.1%}  "
                 f"{pr.get('samples_per_s', 0):.1f} samples/s  (compute {fmt_time(pr['compute_s'])}, "
                 f"comm {fmt_time(pr['comm_s'])}, bubble {fmt_time(pr.get('bubble_s', 0))})")
    if timing:
        cached = " (cached)" if timing.get("capture_cached") else ""
        lines.append(f"time      capture {timing.get('capture_s', 0):.2f} s{cached}, search {timing.get('search_s', 0):.2f} s")
    for n in d.get("notes", []):
        lines.append(f"  - {n}")
    return "\n".join(lines)


def run(args):
    from ..report.progress import Progress        # small: drawn before torch and the model are imported
    from ._paths import check_out
    if args.out:
        check_out(args.out)          # before the search, not after it
        if not args.full:
            from ..plan import operators_path
            check_out(operators_path(args.out), "--out (its operators file)")
    spec = model_spec(args)
    args.settings = model_settings(spec, args.model_arg, args.seq)     # checked before any work
    args.seq_from = seq_source(spec, args.settings, args.seq)
    t0 = time.perf_counter()
    target = getattr(args, "target", None)
    if "+" in args.cluster or args.cluster.strip().lower().endswith(".json"):
        from sapp.cluster.groups import MixedCluster, parse
        mc = parse(args.cluster)
        if isinstance(mc, MixedCluster):         # several device groups: sapp/search/hetero.py
            if args.settings or args.fp8:
                from ..errors import UsageError
                raise UsageError("--seq / --model-arg / --fp8 are not yet recorded in a mixed cluster's plan (sapp run would "
                                 "build the model without them); search each group's kind alone, or drop them")
            from .search_hetero import run_hetero
            return run_hetero(args, spec, mc, constraints_from_args(args))
    if getattr(args, "mixed_mode", "auto") != "auto":
        from ..errors import UsageError
        raise UsageError(f"--mixed-mode {args.mixed_mode} is for mixed clusters (A+B); {args.cluster} is one device kind: "
                         "drop --mixed-mode (--pp pins its pipeline)")
    if getattr(args, "fit_engine_estimate", None) and target != "megatron":
        from ..errors import UsageError
        raise UsageError("--fit-engine-estimate checks Megatron-LM's own memory estimate: add --target megatron")
    if target and args.fp8:       # the engine's own recipe, or one line (sapp/engines/fp8.py)
        from ..engines.fp8 import target_recipe
        from ..errors import UsageError
        from ..engines.mapping import EngineError
        try:
            args.fp8 = target_recipe(target, args.fp8)
        except EngineError as e:
            raise UsageError(str(e)) from None
    if target:
        return _run_target(args, target, t0)
    with Progress(label="search", counts=False) as prog:      # draws on a terminal only; thousandths of the search
        prog.status("importing torch")
        from .. import api
        prog.status(f"capturing {spec} (built on meta, traced into a graph)")
        plan = api.search(spec, args.cluster, global_batch=args.batch, constraints=constraints_from_args(args),
                          precision=args.precision, progress=prog, runtime=args.runtime, cache=not args.no_cache,
                          model_args=args.settings or None, fp8=args.fp8, **_overlap_kwargs(args))
    _finish(args, plan, t0)
    return 0


def _overlap_kwargs(args) -> dict:
    """api.search's moe_a2a_overlap / delay_wgrad from --moe-a2a-overlap / --delay-wgrad (only when given)."""
    return {k: True for k in ("moe_a2a_overlap", "delay_wgrad") if getattr(args, k, False)}


def _run_target(args, target, t0):
    """The search restricted to what `target` states (constraints.TARGETS), priced with its runtime;
    what it still cannot state (a per-block recompute mix) conformed and re-priced (sapp/engines)."""
    from .. import api
    from sapp.search.constraints import TARGETS
    from ..engines import best_plan
    from ..errors import UsageError
    from ..report.progress import Progress
    runtimes = TARGETS[target]["runtimes"]
    if args.runtime is not None and args.runtime not in runtimes:
        raise UsageError(f"--target {target} runs the {' or '.join(runtimes)} runtime, not {args.runtime}; drop --runtime")
    cl = api.resolve_cluster(args.cluster)
    spec, settings = model_spec(args), args.settings or None
    if args.no_cache:
        graph, _ = api.capture_graph(api.resolve_model(spec, model_args=settings)[0])
    else:
        graph = api.capture_spec(spec, settings)[3]
    fits = _estimate_fit(graph, cl, args) if getattr(args, "fit_engine_estimate", None) else None
    with Progress(label="search", counts=False) as prog:
        # what the engine cannot state (a per-block recompute mix) conformed and re-priced; when that
        # changed the plan, the engine's uniform recomputations are searched too (engines.best_plan)
        plan = best_plan(graph, cl, target, global_batch=args.batch, model=spec, constraints=constraints_from_args(args),
                         fits=fits, progress=prog, must_fit=True,
                         settings={"precision": args.precision, "runtime": args.runtime or runtimes[0],
                                   "fp8": args.fp8, **_overlap_kwargs(args)})
    if settings:        # the model the plan was priced on, for sapp run (best_plan searched the captured graph)
        plan["model"]["args"] = dict(sorted(settings.items()))
    _finish(args, plan, t0)
    return 0


def _estimate_fit(graph, cl, args):
    """The search's predicate: Megatron-LM's estimate of the exported file within usable memory."""
    from ..engines.estimate_fit import megatron_fit_for
    return megatron_fit_for(graph, cl, precision=args.precision or cl.precision, version=args.fit_engine_estimate)


def _finish(args, plan, t0):
    timing = dict(getattr(plan, "_timing", {}) or {}, total_s=time.perf_counter() - t0)
    if args.out:
        plan.save(args.out, operators_beside=not args.full)
    if args.json:
        print(plan.to_json(), end="")
    else:
        print(summary(plan, timing, getattr(args, "seq_from", None)))
        if args.out:
            print(f"plan written to {args.out}" + written_beside(args))
