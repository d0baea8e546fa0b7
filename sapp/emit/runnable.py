"""A plan the search returns is a plan the emitter runs.

The emitter refuses some layouts before its first step, from the model itself: a tensor-parallel
split whose ops give other shapes at one rank's layer shapes (a module reshaping by a head count it
fixed for the whole model: sapp/emit/checks/shape_audit.py, the SP pieces: sp_audit.py) or whose split
weight the model reads outside its layer (outside_reads.py), and a pipeline
split torch cannot trace or whose stages cannot run (sapp/emit/pipe.trace and its preflight).  The
cost model cannot see these, so the search runs the same checks on the candidate it is about to
return, when it has the module (sapp's own zoo models excepted: _zoo_model): on a copy whose
parameters and buffers are on meta (nothing is allocated; the user's module is never touched), with
the example inputs the search captured.  A candidate that fails is dropped with every
configuration failing the same way (the tp degree whose shapes fail, the pipeline depth whose
split fails), the next best is searched and checked, at most MAX_DROPS times; the plan's notes say
what was dropped and why.  A tp block that cannot run at one rank's shapes is gathered instead (kept
replicated, the same degree searched again with tp on the rest); only where the gathered block still
fails is the degree dropped.  A pinned option that fails is refused in one line."""
from __future__ import annotations

import copy

from sapp.errors import ConstraintError, PlanError, SappError

MAX_DROPS = 8       # candidates dropped before the search gives up (each costs a search and a check)


def first_runnable(run, module, example_inputs, cons):
    """`run(skip)` -> (plan, result) searches with configurations `skip(cfg)` rules out; returns the
    first plan whose pre-step checks pass (with a note per dropped candidate) and its result."""
    dropped = []            # (rule, what was dropped and why)
    while True:
        skip = _skipper([r for r, _ in dropped])
        try:
            plan, res = run(skip if dropped else None)
        except SappError as e:
            if not dropped:
                raise
            raise ConstraintError(f"no runnable plan: {dropped[-1][1]}, and without it "
                                  f"{' '.join(str(e).split())}") from None
        if module is None or _zoo_model(module):
            return plan, res
        failure = check(module, plan, example_inputs)
        if failure is None:
            for rule, why in dropped:
                if rule[0] == "gather" and plan.parallel["tp"] != rule[1]:
                    # the block was gathered, then that degree lost to another: the plan keeps no tp
                    why += f"; with it gathered, tp={rule[1]} ranked below this plan"
                plan._d["notes"].append(why)
            return plan, res
        rule, msg = failure
        if rule[0] == "gather":
            done = {p for r in dropped if r[0][0] == "gather" and r[0][1] == rule[1] for p in r[0][2]}
            rule = ("gather", rule[1], tuple(p for p in rule[2] if p not in done)) if set(rule[2]) - done \
                else ("tp", rule[1])            # gathered already and still failing: the degree fails
        if rule[0] == "gather":
            # the block is kept replicated and tp shards the rest: the same degree is searched again
            dropped.append((rule, f"tp={rule[1]}: gathered {', '.join(rule[2])} (replicated on every tp "
                                  f"rank, the rest of the model keeps tp): {msg}"))
            if len(dropped) >= MAX_DROPS:
                raise ConstraintError(f"no runnable plan after {len(dropped)} tries; the last: {msg}")
            continue
        pinned = _pinned(rule, cons)
        if pinned:
            raise ConstraintError(f"the pinned {pinned} cannot run this model: {msg}")
        why = f"dropped {res.config.describe()} (every {_rule_str(rule)} alike): {msg}"
        dropped.append((rule, why))
        if len(dropped) >= MAX_DROPS:
            raise ConstraintError(f"no runnable plan after dropping {len(dropped)} candidates; the last: {msg}")


def _zoo_model(module) -> bool:
    """sapp's own zoo models are written for the emitter (its tests run them under every layout)
    and can be huge: the pipeline trace alone of GPT-3 175B's 96 blocks takes ~20 s.  Models from
    Hugging Face configs and factories are checked."""
    spec = getattr(module, "sapp_spec", None)
    return spec is not None and spec.kind not in ("hf", "custom")


def check(module, plan, example_inputs):
    """None when the emitter's pre-step checks pass for `plan` on `module`, else (rule, one line):
    rule ("tp", t) / ("sp", t) / ("pp", p, v) names the configurations failing the same way."""
    par = plan.parallel
    tp, pp = par["tp"], par["pp"]
    if (tp == 1 and pp == 1) or par.get("cp", 1) > 1:
        return None                     # context parallelism checks its own shapes (emit/cp.py)
    try:
        skel = meta_copy(module)
    except Exception:                   # noqa: BLE001 - a module deepcopy refuses: the ranks check at emit
        return None
    ex = _inputs(skel, example_inputs, 2)
    if ex is None:
        return None                     # nothing to trace with: the ranks check at emit
    import contextlib
    import io
    try:
        # torch prints the graphs of traces that fail; the check's answer is its one line
        with contextlib.redirect_stderr(io.StringIO()):
            return _check(module, skel, plan, ex, example_inputs)
    except Exception:                   # noqa: BLE001 - what the meta copy cannot show, the ranks check at emit
        return None


def _check(module, skel, plan, ex, example_inputs):
    from sapp.capture.devices import meta_as_training_device
    from sapp.emit.checks import outside_reads, plan as checks, shape_audit
    from sapp.emit.pp import pipe
    from sapp.emit.tp import parallel as emit_parallel
    from sapp.emit.tp import sp as emit_sp
    par = plan.parallel
    tp, pp = par["tp"], par["pp"]
    styles, groups = checks.tp_modules(plan), checks.tp_groups(plan)
    if tp > 1:
        refused = _unsplit_layers(skel, plan)
        if refused is not None:
            return refused
    with meta_as_training_device():
        if tp > 1 and groups and pp == 1:
            try:
                outside_reads.check_plan(skel, plan, ex)
            except PlanError as e:
                return _reads_rule(skel, plan, ex, tp), _line(e)
        if tp > 1 and groups:
            try:
                sp_sec = emit_sp.section(plan) if pp == 1 else None
                shape_audit.check(skel, styles, groups, tp, ex, [], fix=True, sp_sec=sp_sec or None)
            except PlanError as e:
                if _meta_artifact(e):
                    return None
                rule = _tp_or_sp(module, plan, ex, styles, groups, tp)
                return (_gather_rule(e, tp) if rule[0] == "tp" else None) or rule, _line(e)
        if pp > 1:
            mbs = plan.pipeline.get("micro_batch_size") or 1
            ex = _inputs(skel, example_inputs, mbs)
            local = emit_parallel.local_layers(skel, styles, tp, groups) if tp > 1 else None
            try:
                checks.check_pipeline(plan)
                traced = pipe.trace(skel, pipe.micro_example(ex, mbs), checks.split_points(plan), local=local)
            except PlanError as e:
                if _meta_artifact(e):
                    return None
                return ("pp", pp, plan.pipeline.get("virtual_chunks") or 1), _line(e)
            differ = _stages_differ(skel, plan, traced)
            if differ:
                return ("pp", pp, plan.pipeline.get("virtual_chunks") or 1), differ
    return None


def _unsplit_layers(skel, plan):
    """The manifest's tp_modules as the emitter would expect them (emit/checks/manifest.py: the plan's
    styles and the layers its operators split) against the layers it can split: DTensor's styles
    split Linear, Embedding and HF Conv1D layers only.  A plan naming another module
    (nn.MultiheadAttention, whose projections its own forward applies) would be refused at `sapp run`
    ("the emitted program differs from the plan"): (("gather", tp, patterns), one line), so the
    search keeps that module replicated and tp on the rest."""
    from torch import nn
    from sapp.emit.checks import plan as checks, stage_read as manifest
    from sapp.emit.tp import conv1d
    from sapp.search.tp_layout import gather_pattern
    from sapp.emit.tp import mha
    types = {n: type(m) for n, m in skel.named_modules()}
    wanted = {**manifest.priced_tp(plan, types), **checks.tp_modules(plan)}
    tp = plan.parallel["tp"]
    mods = dict(skel.named_modules())
    for n in sorted(n for n, s in wanted.items() if s == "heads" and n in mods):
        # nn.MultiheadAttention split by heads runs its own forward (sapp/emit/tp/mha.py): one stage only
        why = mha.unsupported(mods[n], tp) or ("in a pipeline stage (traced: its forward is torch's)"
                                               if plan.parallel["pp"] > 1 else "")
        if why:
            return (("gather", tp, (gather_pattern(n),)),
                    f"tensor parallelism tp={tp}: the plan splits {n} by heads, but it is {why}")
    bad = sorted(n for n in wanted if n in types and types[n] is not nn.Module and wanted[n] != "heads"
                 and not issubclass(types[n], (nn.Linear, nn.Embedding)) and not conv1d.is_conv1d_class(types[n]))
    if not bad:
        return None
    return (("gather", tp, tuple(sorted({gather_pattern(n) for n in bad}))),
            f"tensor parallelism tp={tp}: the plan splits {bad[0]} ({types[bad[0]].__name__}), a module the emitter "
            f"does not split (it splits Linear, Embedding and HF Conv1D layers): keep it out of tp_modules")


def _stages_differ(skel, plan, traced):
    """The manifest's stages as the emitter reads them off the traced stages (emit/checks/manifest.py:
    the blocks each stage runs, by the same candidates) against the plan's listing: one line where
    `sapp run` would refuse the plan, else None.  (Interleaved chunks are left to the ranks.)"""
    from types import SimpleNamespace
    from sapp.capture.blocks import container_children
    from sapp.emit.checks import stage_read as manifest
    if (plan.pipeline.get("virtual_chunks") or 1) > 1:
        return None
    prog = SimpleNamespace(stage_block_list=sorted(container_children(skel)), plan=plan,
                           full_modules={n: type(m) for n, m in skel.named_modules()})
    cands = manifest.stage_candidates(prog)
    for st in plan.pipeline.get("stages") or []:
        i = st.get("index")
        exp = sorted(b for b in st.get("blocks") or [] if prog.stage_block_list or b in cands)
        if not isinstance(i, int) or i >= traced.num_stages or not exp:
            continue
        got = manifest._stage_blocks(traced.get_stage_module(i), cands)
        if got != exp:
            return (f"pipeline stage {i} would run blocks {got} where the plan lists {exp} (the emitter refuses "
                    f"such a plan): pin pp=1 or other split points")
    return None


def _gather_rule(e, tp):
    """("gather", tp, patterns): the sharded region a failed audit sits in (shape_audit._refusal),
    kept replicated while tp shards the rest (search/tp_layout.gathered); None when the audit names
    no region (first_runnable drops the degree when the region is gathered already)."""
    from sapp.search.tp_layout import gather_pattern
    new = sorted({gather_pattern(m) for m in getattr(e, "gather", None) or []})
    return ("gather", tp, tuple(new)) if new else None


def _meta_artifact(e) -> bool:
    """A failure of the meta copy itself, not of the plan: model code that makes a CPU tensor in its
    forward (a constant, an `arange` without a device) meets meta activations there, while the ranks
    run real CPU weights; such a plan is left to the ranks' own checks at emit."""
    text = str(e)
    return "meta" in text and ("DeviceMismatch" in text or "same device" in text)


def _reads_rule(skel, plan, ex, tp):
    """Which rule a read outside a split layer breaks: ("sp", tp) when only a norm sequence
    parallelism splits is read (the same tp without SP may run), else ("tp", tp)."""
    from sapp.emit.checks import outside_reads
    if not plan.parallel.get("sp"):
        return ("tp", tp)
    try:
        outside_reads.check_plan(skel, plan, ex, with_sp=False)
    except PlanError:
        return ("tp", tp)
    return ("sp", tp)


def _tp_or_sp(module, plan, ex, styles, groups, tp):
    """Which rule a failed tensor-parallel audit breaks: ("sp", tp) when the layout passes without
    its sequence pieces (the same tp without SP may run), else ("tp", tp)."""
    from sapp.emit.checks import shape_audit
    if not plan.parallel.get("sp"):
        return ("tp", tp)
    try:
        shape_audit.check(meta_copy(module), styles, groups, tp, ex, [], fix=True)
    except PlanError:
        return ("tp", tp)
    return ("sp", tp)


def meta_copy(module):
    """A deep copy of `module` with every parameter and buffer on meta (its own attributes, hooks and
    submodules copied): the checks may set attributes and split points on it."""
    import torch
    from torch import nn
    memo = {}
    for p in module.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(module, memo)


def _inputs(skel, example_inputs, batch):
    """The search's example inputs on meta (a zoo model's own at `batch` when none were given)."""
    import torch
    if example_inputs is None:
        try:
            import sapp.models as models  # not `from . import`: sapp.__getattr__ recurses on it
            ex = models.example_inputs(skel, batch, "meta")
        except Exception:                 # noqa: BLE001 - a model without its own inputs
            return None
    else:
        ex = example_inputs
    ex = tuple(ex) if isinstance(ex, (tuple, list)) else (ex,)
    return tuple(torch.empty_like(x, device="meta") if isinstance(x, torch.Tensor) and x.device.type != "meta"
                 else x for x in ex)


def _skipper(rules):
    """skip(cfg) for the rules that drop configurations; `skip.gather` ({tp: module patterns}): the
    blocks the search keeps replicated at that tp (tp_layout.gathering)."""
    gather = {}
    for r in rules:
        if r[0] == "gather":
            gather.setdefault(r[1], set()).update(r[2])

    def skip(cfg):
        for r in rules:
            if r[0] == "tp" and cfg.tp == r[1]:
                return True
            if r[0] == "sp" and cfg.tp == r[1] and cfg.sp:
                return True
            if r[0] == "pp" and cfg.pp == r[1] and (cfg.v or 1) == r[2]:
                return True
        return False
    skip.gather = {t: frozenset(v) for t, v in sorted(gather.items())}
    return skip


def _rule_str(rule) -> str:
    return {"tp": lambda: f"tp={rule[1]}", "sp": lambda: f"tp={rule[1]} with sequence parallelism",
            "pp": lambda: f"pp={rule[1]}" + (f" with {rule[2]} virtual chunks" if rule[2] > 1 else "")}[rule[0]]()


def _pinned(rule, cons):
    if rule[0] == "tp" and cons.tp is not None:
        return f"tp={cons.tp}"
    if rule[0] == "sp" and cons.sp:
        return f"sp=true at tp={rule[1]}"
    if rule[0] == "pp" and cons.pp is not None:
        return f"pp={cons.pp}"
    return None


def _line(e) -> str:
    return " ".join(str(e).split())
