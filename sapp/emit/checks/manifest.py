"""What a rank actually runs, read off the built program, next to what the plan says it should run.

    observed(prog)          -> manifest of the running objects (FSDP modules, optimizers, DTensor
                               placements, checkpointed regions, schedule class, host tables)
    expected(plan, prog)    -> the same fields as the plan prices them, for this rank
    differences(exp, obs)   -> ["zero: plan 1, emitted 2", ...]

Fields: zero (0-3), fsdp_units, recompute {block: {mode, region, ops}}, tp_modules {module: style}, sp
{norms, entries} (sequence parallelism: sapp/emit/tp/sp.py),
stages {stage: [outermost blocks]}, schedule, micro_batches, host {param: host-table|offload}, precision,
runtime (always "eager": a plan priced for the "fused" runtime is a prediction for Megatron-Core-like
kernels that the emitted torch program does not run), ep (expert-parallel degree), cp (context-parallel
degree the attention modules were rewritten for, sapp/emit/cp/cp.py).
`observed` never reads the emitter's own bookkeeping where the object itself can say (a module is an
FSDP unit because fully_shard changed its class, a layer is column-parallel because its weight is a
DTensor sharded on dim 0 over "tp", colwise_gather when the output hook DTensor registered on it
brings its output back to Replicate); recompute regions and their operators come from the checkpoint
wrapper, which records the ops its policy marked for recomputation during the first forward.
`sapp.emit.emit` raises a PlanError naming the first differing field, or with allow_mismatch=True
keeps going with a loud note and a re-priced prediction (see `reprice`)."""
from __future__ import annotations

from torch import nn

from ...errors import PlanError
from . import plan as checks
from ..tp import conv1d, mha as mha_mod, sp as sp_mod
from ..ep import experts as ep_mod
from ..pp import pipe
from ..recompute import checkpointing as recompute
from .stage_read import _graphs, _runs, _stage_blocks, priced_tp, stage_candidates  # noqa: F401  (read from here too)

ROOT = "<root>"


def _unwrap(m):
    inner = getattr(m, "module", None)
    return inner if isinstance(inner, nn.Module) else m


def _stage_mods(prog) -> dict:
    return {s: _unwrap(m) for s, m in zip(prog.stage_indices, prog.modules)}


def _blocks_in(mod, blocks) -> list:
    names = dict(mod.named_modules())
    return [b for b in blocks if b in names]


# ---- observed ------------------------------------------------------------------------------------
def _is_fsdp(m) -> bool:
    return type(m).__name__.startswith("FSDP")


def _reshards(m) -> bool:
    try:
        group = m._get_fsdp_state()._fsdp_param_group
        return group is not None and group.post_forward_mesh_info is not None
    except Exception:
        return True


def _tp_style(mod, tp_dim):
    w = getattr(mod, "weight", None)
    if w is None or not hasattr(w, "placements"):
        return None
    names = getattr(w.device_mesh, "mesh_dim_names", None) or ()
    if "tp" not in names:
        return None
    pl = w.placements[names.index("tp")]
    dim = getattr(pl, "dim", None)
    if dim is None:
        return None
    if isinstance(mod, nn.Embedding):
        style = "vocab" if dim == 0 else "colwise"
    elif conv1d.is_conv1d(mod):                # HF's Conv1D: weight [in, out]
        style = "colwise" if dim == 1 else "rowwise"
    else:
        style = "colwise" if dim == 0 else "rowwise"
    if style == "colwise" and _gathers_output(mod):
        return "colwise_gather"
    return style


def _gathers_output(mod) -> bool:
    """Whether a column-split layer's output is brought back to Replicate (ColwiseParallel with
    output_layouts=Replicate(): an LM head) rather than left split for a row-split closer.  Read off
    the forward hook DTensor's distribute_module registered on the module: a closure over
    partial(_prepare_output_fn, output_layouts, use_local_output)."""
    import functools
    from torch.distributed.tensor import Replicate
    for hook in getattr(mod, "_forward_hooks", {}).values():
        for cell in getattr(hook, "__closure__", None) or ():
            try:
                fn = cell.cell_contents
            except ValueError:
                continue
            if isinstance(fn, functools.partial) and getattr(fn.func, "__name__", "") == "_prepare_output_fn" \
                    and fn.args and isinstance(fn.args[0], tuple):
                return all(isinstance(p, Replicate) for p in fn.args[0])
    return False


def observed(prog) -> dict:
    mods = _stage_mods(prog)
    units, tp, stages, host = [], {}, {}, {}
    zero = 0
    for s, mod in sorted(mods.items()):
        pre = f"stage{s}:" if len(mods) > 1 else ""
        stages[str(s)] = _stage_blocks(mod, stage_candidates(prog))
        heads, inner = mha_mod.observed(mod)       # nn.MultiheadAttention split by heads: one entry
        tp.update(heads)
        for name, m in mod.named_modules():
            if _is_fsdp(m):
                units.append(pre + (name or ROOT))
                zero = max(zero, 3 if _reshards(m) else 2)
            style = _tp_style(m, "tp") if isinstance(m, (nn.Linear, nn.Embedding)) or conv1d.is_conv1d(m) else None
            if style and name not in inner:
                tp[name] = style
            if type(m).__name__ == "HostEmbedding":
                host[f"{name}.weight"] = "host-table"
        names = {id(p): n for n, p in mod.named_parameters()}
        for opt in prog.optimizers:
            if type(opt).__name__ == "OffloadAdam":
                for p in opt.device_params:
                    if id(p) in names:
                        host[names[id(p)]] = "offload"
    if zero == 0 and any(type(o).__name__ == "ZeroRedundancyOptimizer" or getattr(o, "zero_stage", 0) == 1
                         for o in prog.optimizers):
        zero = 1
    rc = {}
    for b, d in sorted(prog.recompute_done.items()):
        rc[b] = {"mode": d["mode"], "region": d["region"]}
        if d["mode"] == "selective":
            rc[b]["ops"] = ({} if d["region"] is None else
                            recompute.op_signature(d["ops"]) if d["ops"] else None)     # None: no forward yet
            if d.get("unpriced"):   # shown, not compared: copies and elementwise ops, no GEMM / softmax
                prog.recompute_unpriced = dict(getattr(prog, "recompute_unpriced", {}), **{b: list(d["unpriced"])})
    sched = type(prog.schedule).__name__ if prog.schedule is not None else None
    kind = {v: k for k, v in _schedules().items()}.get(sched, "none")
    n = getattr(prog.schedule, "_n_microbatches", None) if prog.schedule is not None else None
    from ..cp.cp import observed_cp
    out = {"zero": zero, "fsdp_units": sorted(units), "recompute": rc, "tp_modules": dict(sorted(tp.items())),
           "stages": stages, "schedule": kind, "micro_batches": int(n or prog.micro_batches or 1),
           "host": dict(sorted(host.items())), "precision": prog.precision, "sp": sp_mod.observed(mods),
           # torch eager kernels under autocast: the emitter runs no fused point-wise chains
           "runtime": "eager",
           # expert parallelism as run: the EP degree the MoE layers dispatch over (sapp/emit/ep/experts.py)
           "ep": max([getattr(m, "sapp_ep", 1) for mod in mods.values() for m in mod.modules()] or [1])}
    # the ranks the all-to-all runs over (one stage's dp ranks under a pipeline), and the pipeline
    # depth the schedule's stages were built for (present when > 1, like the plan's)
    ep_group = sorted({tuple(m.sapp_ep_group) for mod in mods.values() for m in mod.modules()
                       if getattr(m, "sapp_ep_group", None)})
    if ep_group:
        out["ep_group"] = ep_group
    run = getattr(prog, "schedule", None)
    if run is not None:
        out["pp"] = int(run._stages[0].group_size if hasattr(run, "_stages") else run._stage.group_size)
    if getattr(prog, "pp", 1) > 1:      # stage boundaries cut to 1/tp and all-gathered (emit/pipe.scatter_gather)
        out["scatter_gather"] = {str(s): list(getattr(mod, "sapp_scatter_gather", None) or [])
                                 for s, mod in sorted(mods.items())}
    cp = observed_cp(mods.values())      # read off the rewritten attention modules; absent when 1
    return dict(out, cp=cp) if cp > 1 else out


def _schedules():
    from ..pp.pipe import SCHEDULES
    return SCHEDULES


# ---- expected --------------------------------------------------------------------------------------
def expected(plan, prog, regions: dict) -> dict:
    """The plan's fields for this rank.  `regions`: recompute.priced_regions (selective blocks)."""
    from ...placement.schema import resolve
    mods = _stage_mods(prog)
    dp = plan.parallel["dp"] * plan.parallel.get("cp", 1)   # ZeRO shards over dp x cp
    zero = plan.zero if dp > 1 else 0          # with one replica there is nothing to shard
    units, tp, stages, host, rc = [], {}, {}, {}, {}
    modes = prog.recompute_modes
    styles = checks.tp_modules(plan) if plan.parallel["tp"] > 1 else {}
    groups = checks.tp_groups(plan)
    listed = {str(s.get("index")): s.get("blocks") for s in plan.pipeline.get("stages") or []}
    placement = plan.placement or {}
    for s, mod in sorted(mods.items()):
        pre = f"stage{s}:" if len(mods) > 1 else ""
        present = _blocks_in(mod, prog.block_list)
        cands = stage_candidates(prog)
        stages[str(s)] = (sorted(b for b in listed.get(str(s)) or [] if prog.stage_block_list or b in cands)
                          or _stage_blocks(mod, cands) if plan.parallel["pp"] > 1 else _stage_blocks(mod, cands))
        names = dict(mod.named_modules())
        if zero >= 2:
            host_params = {n for n, _ in mod.named_parameters()
                           if (resolve(placement, n) or {}).get("weights") == "host"} if placement.get("groups") else set()
            for b in present:
                if any(f"{b}.{n}" not in host_params for n, _ in names[b].named_parameters()):
                    units.append(pre + b)
            units.append(pre + ROOT)
        # a bare Module only holds a tied weight for another stage's layer (emit/tp/parallel.py)
        wanted = {n: s for n, s in {**priced_tp(plan, prog.full_modules), **styles}.items()
                  if n in names and type(names[n]) is not nn.Module}
        for name, style in wanted.items():
            tp[name] = _meant(name, style, wanted, prog.full_modules, groups)
        tp.update(_aliases(names, wanted, tp))
        for b in sorted(modes):
            if b in names:
                if modes[b] == "full":
                    rc[b] = {"mode": "full", "region": b}
                else:
                    reg = regions.get(b)
                    rc[b] = {"mode": "selective", "region": reg["region"] if reg else None,
                             "ops": reg["priced"] if reg else None}
        if placement.get("groups"):
            for n, p in mod.named_parameters():
                e = resolve(placement, n) or {}
                if e.get("weights") == "host":
                    host[n] = "host-table"
                elif (e.get("master_weights") == "host" or e.get("optimizer") == "host") and p.requires_grad:
                    host[n] = "offload"         # a frozen parameter has no optimizer state to move
    pp = plan.parallel["pp"]
    out = {"zero": zero, "fsdp_units": sorted(units), "recompute": rc, "tp_modules": dict(sorted(tp.items())),
           "stages": stages, "schedule": "none" if pp == 1 else pipe.schedule_run(
               plan.pipeline.get("schedule", "none"), int(plan.pipeline.get("micro_batches") or 1), pp),
           "micro_batches": int(plan.pipeline.get("micro_batches") or 1), "host": dict(sorted(host.items())),
           "precision": prog.plan_precision, "sp": sp_mod.expected(sp_mod.section(plan), mods),
           "runtime": (plan._d.get("settings") or {}).get("runtime", "eager"),
           "ep": int(plan.parallel.get("ep", 1) or 1)}
    fp8 = (plan._d.get("settings") or {}).get("fp8")
    if fp8:                 # the emitter converts no linear layer to FP8: a plan priced so differs
        out["fp8"] = fp8
    if out["ep"] > 1:       # the EP group as priced: ep consecutive dp ranks of this rank's stage
        out["ep_group"] = [tuple(ep_mod.plan_group(plan, prog.rank))]
    if pp > 1:
        out["scatter_gather"] = {str(s): _sg_expected(plan, s) for s in sorted(mods)}
        out["pp"] = int(pp)
    cp = plan.parallel.get("cp", 1)
    return dict(out, cp=cp) if cp > 1 else out


def _sg_expected(plan, s) -> list:
    """The boundary scatter/gather the plan prices for stage s (pipeline.scatter_gather)."""
    if not (plan.pipeline.get("scatter_gather") and plan.parallel["tp"] > 1 and plan.parallel["pp"] > 1):
        return []
    n = checks.stage_count(plan)
    return (["gather-input"] if s > 0 else []) + (["split-output"] if s < n - 1 else [])


def _aliases(names: dict, wanted: dict, tp: dict) -> dict:
    """Layers the plan does not name that hold a weight of one it splits (BART's `shared` table, the
    embeddings' weight): emit re-ties them to the split weight (sapp/emit/tp/parallel.py `retie`), so
    they read as split by rows, an Embedding by vocabulary and a Linear column-wise."""
    split = {id(getattr(names[n], "weight", None)): n for n in wanted if tp.get(n) in ("vocab", "colwise_gather")}
    out = {}
    for name, m in names.items():
        w = getattr(m, "weight", None)
        if name not in wanted and w is not None and id(w) in split and isinstance(m, (nn.Linear, nn.Embedding)):
            out[name] = "vocab" if isinstance(m, nn.Embedding) else "colwise_gather"
    return out


def _meant(name: str, style: str, wanted: dict, types: dict, groups) -> str:
    """What a plan's style for one layer means, in the manifest's vocabulary (the one `_tp_style`
    reads off the running layer).  A layout from sapp's search (tp_layout groups) means its styles
    literally: colwise keeps the output split for the region's closer, colwise_gather gathers it.  A
    hand-written tp_modules (no groups) is read as apply_tp documents it: a colwise layer keeps its
    output split only when a rowwise sibling (same parent) follows it, otherwise (an output head) its
    output is gathered; rowwise on an Embedding is the vocabulary split."""
    from ..tp.parallel import _partnered
    t = types.get(name, nn.Module)
    if style == "rowwise" and issubclass(t, nn.Embedding):
        return "vocab"
    if groups is None and style in ("colwise", "colwise_gather"):
        splittable = {n: ("rowwise" if s == "vocab" else "colwise" if s == "colwise_gather" else s)
                      for n, s in wanted.items() if issubclass(types.get(n, nn.Module), (nn.Linear, nn.Embedding))
                      or conv1d.is_conv1d_class(types.get(n, nn.Module))}
        keep = style == "colwise" and _partnered(name, splittable, "rowwise")
        return "colwise" if keep else "colwise_gather"
    return style


# ---- comparison ------------------------------------------------------------------------------------
def differences(exp: dict, obs: dict, runtime: bool = False) -> list:
    """One line per differing field.  Recompute ops are known only after the first forward: before
    it (runtime=False) an op list still None on the observed side is not a difference."""
    out = []
    for key in exp:
        e, o = exp[key], obs.get(key)
        if key == "recompute" and not runtime:
            o = {b: dict(d, ops=e.get(b, {}).get("ops")) if d.get("ops") is None and "ops" in d else d
                 for b, d in (o or {}).items()}
        if e != o:
            out.append(f"{key}: plan {_short(e)}, emitted {_short(o)}")
    return out


def _short(v, n=160):
    s = repr(v)
    return s if len(s) <= n else s[:n - 3] + "..."


def check(prog, runtime: bool = False) -> list:
    """Compare and act: PlanError on a difference unless prog.allow_mismatch, then loud notes (and,
    once, a re-priced prediction).  Returns the differences."""
    diffs = differences(prog.manifest_expected, observed(prog), runtime=runtime)
    prog.manifest = observed(prog)
    if not diffs:
        return []
    if not prog.allow_mismatch:
        more = f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else ""
        raise PlanError(f"the emitted program differs from the plan: {diffs[0]}{more}; {_remedy(diffs[0])}, or pass "
                        f"--allow-mismatch to run it anyway with a re-priced prediction")
    new = [d for d in diffs if d not in prog.mismatches]
    for d in new:
        prog.notes.append(f"MISMATCH (allowed): {d}")
    prog.mismatches += new
    if new and prog.rank == 0:
        reprice(prog)
    return diffs


# what to change in the plan where the emitter builds another program than it says: regenerating it
# with the same sapp and pins writes the same plan, so the advice names the field's own pin
_REMEDIES = {
    "tp_modules": "take the layers the emitted side lacks out of the plan's tp_modules, or pin tp=1",
    "stages": "pin pp=1, or other split points (pipeline.stages' split_before at modules the emitter cuts)",
    "zero": "set the plan's zero to the emitted stage",
    "fsdp_units": "set the plan's zero to 0 or 1 (units are the model's blocks, as the emitter wraps them)",
    "recompute": "set those blocks' recompute mode in the plan to the emitted one",
    "sp": "search again with sp pinned to false",
    "scatter_gather": "set pipeline.scatter_gather to false",
}


def _remedy(diff: str) -> str:
    """The change that helps for the first differing field (`_REMEDIES`), else the field itself."""
    field = diff.split(":", 1)[0]
    return _REMEDIES.get(field, f"set the plan's {field} to the emitted value")


def rewritten(plan, obs: dict, blocks: list, modes: dict) -> dict:
    """The plan's data with the fields the cost model can express set to what runs (this rank's view:
    ZeRO stage, per-block recompute modes, tensor-parallel layers)."""
    import copy
    d = copy.deepcopy(plan._d)
    if "runtime" in obs:
        d.setdefault("settings", {})["runtime"] = obs["runtime"]
    d.get("settings", {}).pop("fp8", None)          # the emitter runs bf16 linears (observed has no fp8)
    for k in ("moe_a2a_overlap", "delay_wgrad"):    # nor Megatron's all-to-all overlap (emit/ep/experts.py)
        d.get("settings", {}).pop(k, None)
    if plan.parallel["dp"] > 1:
        d["zero"] = obs["zero"]
    mine = {b for bs in obs["stages"].values() for b in bs}
    blocks = {b: modes.get(b, "none") for b in blocks}
    for b in mine:
        blocks[b] = obs["recompute"].get(b, {}).get("mode", "none")     # planned here but not emitted: none
    d["recompute"] = {"default": "none", "blocks": blocks}
    if plan.parallel["tp"] > 1:
        d["tp_modules"] = dict(obs["tp_modules"])
    return d


def reprice(prog) -> None:
    """prog.reprice (sapp.evaluate, handed in by sapp.emit and `sapp run`: the emitter sits below the
    api) of the plan rewritten to what runs; the result goes to prog.repriced and a note."""
    from ...plan import Plan
    if prog.reprice is None:
        prog.notes.append("MISMATCH: not re-priced: emit was given no reprice callable (sapp.emit and `sapp run` "
                          "pass sapp.api.reprice_as_run)")
        return
    try:
        import sapp.models as models  # not `from .. import`: sapp.__getattr__ recurses on it
        name = prog.plan.model.get("name")
        model = name if name in set(models.names()) else prog.full_model
        if model is None:
            raise PlanError("a pipeline rank of a model the zoo does not know keeps no whole model to capture")
        res = prog.reprice(model, Plan(rewritten(prog.plan, prog.manifest, prog.block_list, prog.recompute_modes)))
    except Exception as e:
        prog.notes.append(f"MISMATCH: could not re-price what runs ({type(e).__name__}: {str(e)[:120]})")
        return
    prog.repriced = res
    old = prog.plan.predicted.get("step_time_s")
    prog.notes.append(f"MISMATCH: re-priced as run: step {res['step_time_s'] * 1e3:.3f} ms (plan said "
                      f"{(old or float('nan')) * 1e3:.3f} ms), peak memory {res['peak_memory_bytes'] / 2**20:.2f} MiB")
