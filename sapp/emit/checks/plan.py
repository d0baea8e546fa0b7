"""Refuse a plan that cannot run here, before any process touches a collective: wrong world size, a
plan made for another model, module names the model does not have.  Messages are one line and say what
to change."""
from __future__ import annotations

import torch
from torch import nn

from ...errors import PlanError
from ...pipeline.dualpipe import dualpipev_problem
from ...plan import Plan

# colwise_gather: a column split whose output is gathered (a lone LM head); vocab: an embedding
# split over its rows; heads: an nn.MultiheadAttention split by heads (sapp/emit/tp/mha.py)
TP_STYLES = ("colwise", "colwise_gather", "rowwise", "vocab", "heads")
SCHEDULES = ("none", "gpipe", "1f1b", "interleaved", "dualpipev")


def as_plan(plan) -> Plan:
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, dict):
        return Plan(plan)
    return Plan.load(plan)          # a path


def unique_param_count(model: nn.Module) -> int:
    """Trainable parameters counted once even when tied (GPT-2 embedding/head): what a plan's
    `model.params` counts (OpGraph.param_count).  A frozen parameter (Whisper's sinusoidal
    embed_positions) is in neither count."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _captures(model: nn.Module, example_inputs):
    """Graphs sapp.capture gives this model: of the model alone and of model + loss (the zoo's
    WithLoss, which search may have captured).  None of them when capture is unavailable or fails."""
    try:
        from ...capture import capture
    except Exception:
        return
    if example_inputs is None:
        try:
            import sapp.models as models  # not `from .. import`: sapp.__getattr__ recurses on it
            from ...capture import DEFAULT_BATCH as CAPTURE_BATCH   # the batch the search captures at
            # the batch search captures at: a batch of 2 coincides with BERT's 2 token types, and the
            # batch dims capture infers (part of the fingerprint) then differ
            example_inputs = models.example_inputs(model, CAPTURE_BATCH)    # on the model's device (meta is fine)
        except Exception:
            return
    try:
        yield capture(model, tuple(example_inputs))
    except Exception:
        return
    try:
        import sapp.models as models  # not `from .. import`: sapp.__getattr__ recurses on it
        target = models.example_targets(model, example_inputs[0].shape[0], example_inputs[0].device)
        yield capture(models.WithLoss(model), tuple(example_inputs), target=target)
    except Exception:
        return


def check_model(model: nn.Module, plan: Plan, name: str = "", example_inputs=None, fingerprint: bool = True):
    """Refuse a plan made for another model; returns the capture whose fingerprint matched, or None."""
    mine = plan["model"]
    spec = getattr(model, "sapp_spec", None)
    if spec is not None and mine.get("name") and not name:
        name = spec.name
        try:
            import sapp.models as models  # not `from .. import`: sapp.__getattr__ recurses on it
            zoo = set(models.names())
        except Exception:
            zoo = set()
        if mine["name"] in zoo and mine["name"] != spec.name:
            raise PlanError(f"plan was made for model {mine['name']!r} but this model is {spec.name!r}; "
                            f"search a new plan for it")
    want = mine.get("params")
    have = unique_param_count(model)
    # plan floats keep 6 significant digits, so compare with a matching relative slack
    if isinstance(want, (int, float)) and want > 0 and abs(have - want) > max(1.0, 1e-5 * want):
        raise PlanError(f"plan was made for model {mine.get('name')!r} with {want:.6g} parameters but this model has "
                        f"{have}; search a new plan for this model")
    if fingerprint and mine.get("fingerprint"):
        seen = []
        for g in _captures(model, example_inputs):
            if g.fingerprint() == mine["fingerprint"]:
                check_flops(plan, g.flops_per_sample())
                return g
            seen.append(g.fingerprint())
        if seen:
            plan.check_model(seen[0], name)
    return None


def check_flops(plan: Plan, have: float) -> None:
    """The plan's FLOPs per sample against the model's, within 5%: a plan priced from other FLOPs (a
    capture cache entry tampered with, a hand edit) prices another model, so it is refused.  Plans written before
    the field existed carry none and are checked by structure alone."""
    want = plan["model"].get("flops_per_sample")
    # 5%: a capture at another batch moves the few ops that do not scale with it (a GPT's loss: 0.2%);
    # another model or a tampered graph is off by far more
    if isinstance(want, (int, float)) and not isinstance(want, bool) and abs(have - want) > max(1.0, 0.05 * abs(have)):
        raise PlanError(f"plan was priced for {want:.6g} forward FLOPs per sample but this model has {have:.6g}; "
                        f"search a new plan for this model (sapp search --no-cache if its capture cache is suspect)")


def check_world(plan: Plan, world: int) -> None:
    if plan.devices != world:
        raise PlanError(f"plan is for {plan.devices} devices (dp={plan.parallel['dp']}, tp={plan.parallel['tp']}, "
                        f"pp={plan.parallel['pp']}) but this job has {world} processes; launch with --nproc {plan.devices}")


def check_names(model: nn.Module, plan: Plan) -> None:
    mods = dict(model.named_modules())
    for name, style in sorted(tp_modules(plan).items()):
        if style not in TP_STYLES:
            raise PlanError(f"tp_modules[{name!r}] is {style!r}; use 'colwise', 'rowwise' or 'vocab' "
                            f"('colwise_gather': a column split whose output is gathered)")
        if name not in mods:
            raise PlanError(f"tp_modules names {name!r}, which this model does not have; regenerate the plan for this model")
        if style == "heads" and not isinstance(mods[name], nn.MultiheadAttention):
            raise PlanError(f"tp_modules[{name!r}] is 'heads' but {name} is a {type(mods[name]).__name__}, "
                            f"not an nn.MultiheadAttention")
        if style == "vocab" and not isinstance(mods[name], nn.Embedding):
            raise PlanError(f"tp_modules[{name!r}] is 'vocab' but {name} is a {type(mods[name]).__name__}, not an Embedding")
    sched = plan.pipeline.get("schedule", "none")
    if sched not in SCHEDULES:
        raise PlanError(f"pipeline.schedule is {sched!r}; use one of {', '.join(SCHEDULES)}")
    for point in split_points(plan):
        if point not in mods:
            raise PlanError(f"pipeline splits before {point!r}, which this model does not have; regenerate the plan")
    for name in sorted(plan.recompute.get("blocks", {})):
        if name not in mods:
            raise PlanError(f"recompute names block {name!r}, which this model does not have; regenerate the plan")


def tp_modules(plan: Plan) -> dict:
    try:
        return dict(plan["tp_modules"] or {})
    except KeyError:
        return {}


def tp_groups(plan: Plan):
    """The regions of a layout derived from the graph (plans from sapp's search), or None for a
    hand-written tp_modules (emit then pairs layers by their parent module)."""
    layout = plan._d.get("tp_layout") or {}
    groups = layout.get("groups")
    return [list(g) for g in groups] if isinstance(groups, list) else None


def split_points(plan: Plan) -> list:
    """Module names where a new pipeline stage begins, in stage order.

    A stage's `split_before` names the first module of the NEXT stage (the last stage has none).  A
    plan that instead names each stage's own first module is accepted too: a name equal to stage 0's
    first block is dropped.  Stages without split_before fall back to their first block."""
    pipe = plan.pipeline
    stages = sorted(pipe.get("stages") or [], key=lambda s: s.get("index", 0))
    n = len(stages)
    if n <= 1:
        return []
    first0 = (stages[0].get("blocks") or [None])[0]
    points = [s.get("split_before") for s in stages if s.get("split_before") and s.get("split_before") != first0]
    if len(points) != n - 1:
        starts = [(s.get("blocks") or [None])[0] for s in stages[1:]]
        if all(starts):
            points = starts
    if len(points) != n - 1 or len(set(points)) != len(points):
        raise PlanError(f"pipeline has {n} stages but {len(points)} distinct split points {points}; each stage except "
                        f"the last needs split_before naming the first module of the next stage")
    return points


def stage_count(plan: Plan) -> int:
    pp = plan.parallel["pp"]
    sched = plan.pipeline.get("schedule", "none")
    v = int(plan.pipeline.get("virtual_chunks") or 1) if sched == "interleaved" else 1
    return pp * (2 if sched == "dualpipev" else v)      # DualPipeV: 2 stages a rank, in a V


def check_pipeline(plan: Plan) -> None:
    pp = plan.parallel["pp"]
    sched = plan.pipeline.get("schedule", "none")
    if pp == 1:
        return
    if sched == "none":
        raise PlanError(f"plan has pp={pp} but pipeline.schedule is 'none'; set it to gpipe, 1f1b, interleaved "
                        f"or dualpipev")
    if sched == "dualpipev" and dualpipev_problem(pp, plan.pipeline["micro_batches"]):
        raise PlanError(dualpipev_problem(pp, plan.pipeline["micro_batches"]))
    if sched == "dualpipev" and plan["zero"] == 3:
        # measured: 2 x 2 gloo ranks 7.9e-3 off one process after 3 steps (tests/test_dualpipev.py)
        raise PlanError("dualpipev with ZeRO-3 is not emitted: FSDP2's reshard after forward beside torch's "
                        "weight-gradient pass run later (stage_backward_weight) trains wrong; use zero <= 2")
    gb, dp, m = plan.model.get("global_batch"), plan.parallel["dp"], plan.pipeline["micro_batches"]
    if isinstance(gb, int) and gb % (dp * m):
        raise PlanError(f"global batch {gb} does not split into dp={dp} x micro_batches={m}; use a multiple of {dp * m}")
    n = stage_count(plan)
    stages = sorted(plan.pipeline.get("stages") or [], key=lambda s: s.get("index", 0))
    listed = [bool(s.get("blocks")) for s in stages]
    # (a hand-written plan may name split points only: no stage lists blocks, nothing to check).
    # Llama 3's layout: the model's first / last virtual stage may hold the embedding / the head and
    # loss alone; a virtual stage without blocks anywhere else runs nothing
    if n > pp and any(listed) and not all(listed[1:-1]):
        raise PlanError("the plan's interleaved layout has a virtual stage in the middle of the model with no block; "
                        "only the first (embedding) and the last (head and loss) may hold none: regenerate the plan")
    if len(plan.pipeline.get("stages") or []) != n:
        raise PlanError(f"plan has pp={pp}{' x virtual_chunks' if n != pp else ''} = {n} pipeline stages to run but lists "
                        f"{len(plan.pipeline.get('stages') or [])}; regenerate the plan")


def check_all(model: nn.Module, plan: Plan, world: int, name: str = "", example_inputs=None,
              fingerprint: bool = True):
    """Every model-level check; returns the model's capture when the fingerprint check made one."""
    if any(p.is_meta for p in model.parameters()):
        raise PlanError("the model has meta (unallocated) parameters; build it with real weights, e.g. "
                        "sapp.models.get(name, device='cpu'), before emitting")
    check_world(plan, world)
    graph = check_model(model, plan, name, example_inputs, fingerprint)
    check_pipeline(plan)
    check_names(model, plan)
    check_placement(plan)
    check_batch_statistics(model, plan)
    check_optimizer(plan)
    return graph


# optimizer states priced for an engine's own optimizer, which emit does not build (DeepSpeed's bf16
# master weights / optimizer states): run here, the step would hold fp32 masters and moments
ENGINE_ONLY_OPTIMIZERS = {"adam-bf16-master": "DeepSpeed's bf16.bf16_master_weights_and_grads",
                          "adam-bf16-states": "DeepSpeed's bf16.bf16_optimizer_states",
                          "adam-bf16": "torchtitan's training.dtype bfloat16 (no fp32 master weights)"}


def check_optimizer(plan: Plan) -> None:
    rep = plan["parallel"].get("dp_replicate", 1)
    if rep > 1:
        raise PlanError(f"plan parallel.dp_replicate={rep} is torchtitan's HSDP, which sapp's own program does not run "
                        f"(its FSDP2 shards over every data-parallel rank): run the plan with torchtitan (`sapp export "
                        f"--to torchtitan`), or search again without --target torchtitan")
    mods = (plan._d.get("settings") or {}).get("recompute_modules")
    if mods:
        raise PlanError(f"plan settings.recompute_modules {' '.join(mods)} prices Megatron-Core's selective recomputation "
                        f"of those modules, which sapp's own program does not run (its selective recomputes the "
                        f"attention core): run the plan with Megatron-LM (`sapp export --to megatron`)")
    opt = (plan._d.get("settings") or {}).get("optimizer")
    if opt in ENGINE_ONLY_OPTIMIZERS:
        engine = "torchtitan" if opt == "adam-bf16" else "deepspeed"
        raise PlanError(f"plan settings.optimizer {opt!r} prices {ENGINE_ONLY_OPTIMIZERS[opt]}, which "
                        f"sapp's own program does not run (its Adam keeps fp32 masters and moments): run the plan "
                        f"with {engine} (`sapp export --to {engine}`), or import the config without that field")


def check_batch_statistics(model: nn.Module, plan: Plan) -> None:
    """A norm that normalises by statistics over the batch (BatchNorm, or any layer keeping running
    batch statistics) must see the whole batch, as one process does.  Over dp the emitter syncs a
    torch BatchNorm's statistics (emit/dp/batch_stats.py) in a whole module, not in a traced pipeline
    stage; a micro-batch's statistics are not the batch's (RegNet, tp2 with 8 accumulation steps:
    2.8e-1 off), and a layer of another class cannot be synced (HF's own: dp2 4.6e-2 off).  The
    search plans none of these; a hand-written plan is refused here.  In eval mode the running
    statistics are used and any split is exact."""
    gb = plan.model.get("global_batch")
    dp, m, pp = plan.parallel["dp"], plan.pipeline.get("micro_batches", 1) or 1, plan.parallel["pp"]
    if not isinstance(gb, int) or dp * m <= 1:
        return
    from ...capture.batchy import batch_stat_modules
    for name, kind in batch_stat_modules(model).items():
        mod, torch_bn = model.get_submodule(name), kind == "torch"
        why = (f"a micro-batch of {gb // (dp * m)} (micro_batches={m}) computes differently from the whole batch"
               if m > 1 else f"dp={dp} cannot sync inside a pipeline stage (pp={pp})" if pp > 1 else
               f"dp={dp} cannot sync in a layer that is not a torch BatchNorm" if not torch_bn else None)
        if why:
            raise PlanError(f"module {name!r} ({type(mod).__name__}) normalises by batch statistics, which {why}; "
                            f"pin micro_batches=1 (and dp=1 with pp > 1) in the constraints, or train in eval mode")


def check_placement(plan: Plan) -> None:
    """Refuse what the search may plan but the emitter cannot run yet, before any process trains."""
    groups = (plan.placement or {}).get("groups") or {}
    offload = any(g.get("master_weights") == "host" for g in groups.values())
    if offload and plan.zero == 3:
        raise PlanError("the plan offloads the optimizer under ZeRO-3 (ZeRO-3-Offload), which sapp does not emit yet; "
                        "search again with --zero 2 (or pin placement to the device) to get an emittable plan")


def check_pipeline_split(model: nn.Module, plan: Plan, example_inputs=None) -> None:
    """`sapp run`'s pre-flight of a pipeline plan, before launching: trace the split on `model`
    (meta weights are fine) and run every stage on fake tensors (sapp/emit/checks/preflight.py), so a
    split torch cannot run is refused here in one line rather than on the ranks.  Without example
    inputs (and none from the model zoo) it returns: the ranks run the same check in emit."""
    if plan.parallel["pp"] == 1:
        return
    from ..pp import pipe
    mbs = plan.pipeline.get("micro_batch_size") or 1
    dev = next((p.device for p in model.parameters()), None)
    if example_inputs is None:
        try:
            import sapp.models as models  # not `from .. import`: sapp.__getattr__ recurses on it
            example_inputs = models.example_inputs(model, mbs, dev or "cpu")
        except Exception:
            return
    ex = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    pipe.trace(model, pipe.micro_example(ex, mbs), split_points(plan))
