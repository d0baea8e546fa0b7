"""`sapp.search` and `sapp.evaluate`: capture -> joint search -> Plan, and re-scoring a plan.

    plan = sapp.search("gpt3-175b", "a100-80g:nodes=128")            # zoo name + cluster spec
    plan = sapp.search(my_module, cluster, example_inputs=(x,), global_batch=256)
    report = sapp.evaluate("gpt3-175b", "a100-80g:nodes=128", sapp.Plan.load("plan.json"))
"""
from __future__ import annotations

import math
import sys
import time

from sapp.cluster import Cluster
from sapp.search.constraints import Constraints
from sapp.costmodel import CostSettings
from sapp.errors import CaptureError, ClusterError, PlanError, SappError
from sapp.pipeline.schedule import too_long
from sapp.plan import Plan
from sapp.plan.build import build_plan, operator_section
from sapp.api.from_plan import _hsdp_target, _plan_config, _plan_splits, constraints_from_plan  # noqa: F401

from sapp.capture import DEFAULT_BATCH as CAPTURE_BATCH   # batch dims show only at batch > 1; the search rebatches


# ---- inputs ---------------------------------------------------------------------------------------
def resolve_cluster(cluster) -> Cluster:
    if isinstance(cluster, Cluster):
        return cluster.validate()
    if isinstance(cluster, str) and "+" not in cluster:
        return Cluster.parse(cluster)
    if isinstance(cluster, str) or type(cluster).__name__ == "MixedCluster":
        raise ClusterError("a cluster of several device groups is planned by `sapp search --cluster A+B` or "
                           "sapp.api.mixed.search (data-parallel groups with uneven batch shares)")
    raise SappError(f"cluster must be a Cluster or a spec string like 'a100-80g:nodes=16', got {type(cluster).__name__}")


def resolve_model(model, raw: bytes | None = None, model_args: dict | None = None):
    """(module, name, zoo config or None); `raw`: an HF config's bytes already read; `model_args`: the
    spec's settings (a zoo model's config keys, an HF config's fields and `seq`, a factory's keywords)."""
    import importlib
    zoo = importlib.import_module("sapp.models")  # not `from . import models`: sapp.__getattr__ recurses
    if isinstance(model, str):       # zoo name | pkg.module:factory | HF config.json (sapp/models/resolve.py)
        from sapp.models import resolve
        args = dict(model_args or {})
        return resolve.build(model, device="meta", raw=raw, **args), model, resolve.info(model, **args)
    if model_args:
        raise SappError("model_args set a zoo name's, HF config's or factory's settings; build the module with them")
    spec = getattr(model, "sapp_spec", None)
    if spec is not None:
        return model, spec.name, dict(spec.config)
    import torch.nn as nn
    if not isinstance(model, nn.Module):
        raise SappError(f"model must be a torch.nn.Module, a zoo name, 'pkg.module:factory' or a config.json path, "
                        f"got {type(model).__name__}")
    return model, type(model).__name__, None


def check_prediction(step_s, mfu, ceiling: float = 1.0):
    """The last guard before a prediction is shown or stored: a finite positive step that does not
    beat the devices' peak.  Cluster figures inside their bounds can still combine into nonsense
    (a compute_scale that undoes the FLOPs); then the cluster is refused, never the numbers printed."""
    if not (isinstance(step_s, (int, float)) and math.isfinite(step_s) and step_s > 0):
        raise ClusterError(f"the cluster's figures price a step of {step_s} s; check its rates, latencies and "
                           f"compute_scale (sapp calibrate measures them)")
    # `ceiling`: the most of the bf16 peak the devices can do (FP8 linears: the FP8 rate's multiple)
    if not (math.isfinite(mfu) and mfu <= ceiling + 1e-9):
        raise ClusterError(f"the cluster's figures predict {mfu:.1%} of the devices' peak FLOP/s, more than "
                           f"the hardware can do; check peak_flops, compute_efficiency and compute_scale")


def check_fp8(fp8, cluster) -> None:
    """FP8 training needs FP8 tensor cores: refused in one line on a cluster without them."""
    if fp8 and not getattr(cluster, "fp8_peak_flops", 0.0):
        raise ClusterError(f"cluster {cluster.name!r} has no FP8 tensor cores (fp8_peak_flops 0: A100 and V100 have "
                           f"none); drop fp8, or give a cluster with its fp8_peak_flops (Hopper: 1979e12)")


def fp8_ceiling(settings, cluster) -> float:
    from sapp.costmodel.fp8 import fp8_rate_ratio
    return max(1.0, fp8_rate_ratio(cluster)) if settings.fp8 else 1.0


def _check_inputs_bind(module, example_inputs):
    """Positional example inputs must fit forward's signature: torch.fx would otherwise trace a
    keyword-only forward from positional inputs that the real call could never pass."""
    import inspect
    fwd = getattr(module, "forward", None)
    if example_inputs is None or fwd is None:
        return
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    try:
        sig = inspect.signature(fwd)
    except (TypeError, ValueError):     # a C-level forward: nothing to check against
        return
    try:
        sig.bind(*args)
    except TypeError as e:
        raise CaptureError(f"example_inputs ({len(args)} positional) do not fit {type(module).__name__}.forward"
                           f"{sig}: {e}; pass inputs in forward's order") from None


def capture_graph(module, example_inputs=None, loss_fn=None, targets=None):
    """The module's OpGraph (with its loss when `loss_fn` and `targets` are given) and the seconds it took."""
    import contextlib
    import io
    from sapp.capture import capture
    if (loss_fn is None) != (targets is None):
        raise SappError("pass loss_fn and targets together (loss_fn(output, targets) is captured into the graph), "
                        "or neither")
    _check_inputs_bind(module, example_inputs)
    if (loss_fn is None) != (targets is None):
        raise SappError("pass loss_fn and targets together (loss_fn(output, targets) is captured into the graph), "
                        "or neither")
    t0 = time.perf_counter()
    # torch prints tracebacks of its own while a trace fails (fx ShapeProp); the CaptureError says
    # what failed in one line, so that noise is shown only if capture succeeds after all
    noise = io.StringIO()
    try:
        with contextlib.redirect_stderr(noise):
            if example_inputs is None:
                g = capture(module, batch=CAPTURE_BATCH, loss_fn=loss_fn, target=targets)
            else:
                g = capture(module, example_inputs, loss_fn=loss_fn, target=targets)
    except CaptureError:
        raise
    except BaseException:
        sys.stderr.write(noise.getvalue())
        raise
    sys.stderr.write(noise.getvalue())
    return g, time.perf_counter() - t0


def capture_spec(spec: str, model_args: dict | None = None):
    """(module or None, name, info, graph, seconds) of the model spec, through the capture cache:
    a hit builds and traces nothing (module None; no torch import), a miss captures and stores.
    Specs the cache cannot identify (factories) are captured as without it; `model_args` as resolve_model."""
    from sapp.capture import cache
    from sapp.models.resolve import kind_of
    t0 = time.perf_counter()
    # an HF config is read once: its key and its model come from the same bytes
    raw = cache.read_config(spec) if isinstance(spec, str) and kind_of(spec) == "hf" else None
    key = cache.key_for(spec, CAPTURE_BATCH, raw, model_args)
    hit = cache.load(key) if key else None
    if hit is not None:
        graph, info = hit
        return None, spec, info, graph, time.perf_counter() - t0
    module, name, info = resolve_model(spec, raw, model_args)
    graph, capture_s = capture_graph(module)
    if key:
        cache.store(key, graph, info)          # before the search reads (and may stamp) the graph
    return module, name, info, graph, capture_s


# GPT-3 paper batch sizes (sequences of 2048 tokens); other models default to 8 per device.
PAPER_BATCH = {"gpt3-125m": 256, "gpt3-350m": 256, "gpt3-760m": 256, "gpt3-1.3b": 512, "gpt3-2.7b": 512,
               "gpt3-6.7b": 1024, "gpt3-13b": 1024, "gpt3-175b": 1536}


def default_global_batch(info, devices) -> int:
    if info and info.get("name") in PAPER_BATCH:
        return PAPER_BATCH[info["name"]]
    if info:
        for key in ("global_batch", "batch"):
            v = info.get(key) if isinstance(info, dict) else None
            if isinstance(v, int) and v > 0:
                return v
            cfg = info.get("config") if isinstance(info, dict) else None
            if isinstance(cfg, dict) and isinstance(cfg.get(key), int):
                return cfg[key]
    return 8 * devices


# ---- search ---------------------------------------------------------------------------------------
def search(model, cluster, *, global_batch=None, example_inputs=None, constraints=None,
           precision=None, progress=None, graph=None, return_result=False, loss_fn=None, targets=None,
           runtime=None, cache=False, optimizer=None, grad_fp32=False, fits=None, caches=None, model_args=None,
           fp8=None, recompute_modules=(), moe_a2a_overlap=False, delay_wgrad=False):
    """Find the fastest plan that fits.  `model`: an nn.Module, a captured OpGraph, a zoo name, "pkg.module:factory" or an
    HF config.json path (sapp/models/resolve.py); `cluster`: a Cluster or a spec string.  With
    `loss_fn(output, targets)` and `targets` (matching example_inputs' batch) the loss is part of the
    captured graph.  Raises InfeasibleError when nothing fits, ConstraintError for contradictory
    constraints.  `precision`: "bf16-mixed" or "fp32"; default: the cluster's (`Cluster.precision`).
    `runtime`: the runtime profile priced, "eager" (default: what sapp's emitter runs) or "fused"
    (Megatron-Core's fused kernels and bf16 activations; docs/ARCHITECTURE.md "Runtime profiles").
    `optimizer`: the optimizer whose states are priced (CostSettings; default "adam").
    `grad_fp32`: gradients held and reduced in fp32 (CostSettings; Megatron without --grad-reduce-in-bf16).
    `fits(result)`: a further test each priced configuration must pass (joint_search; the engines'
    memory estimates, sapp/engines/estimate_fit.py).
    `cache=True`: a zoo name or HF config.json is captured once and read back from the capture cache
    after (sapp/capture/cache.py; `sapp search` does this unless --no-cache); the plan is the same.
    `caches`: a dict kept across searches of the same graph, Cluster object and settings under other
    constraints (engines.best_plan), for what the joint search finds that depends on none of them
    (search/joint/context._shared); the plan is the same.
    `model_args`: settings of a model named by a string (a zoo model's config keys such as `s`, an HF
    config's fields or `seq`, a factory's keywords); the plan records them as model.args, so `sapp run`
    builds the same model.
    `fp8`: FP8 linear layers, "tensorwise" / "tensorwise-tp" (torchtitan's float8 converter) or "delayed" /
    "blockwise" (Megatron-LM's Transformer Engine recipes, the experts' GEMMs too), priced at the cluster's
    fp8_peak_flops (costmodel/fp8.py).
    `recompute_modules`: what "selective" recomputes, Megatron-Core's --recompute-modules (sorted;
    sapp/recompute/modules.py); () = the attention core.  `moe_a2a_overlap`, `delay_wgrad`: as sapp.search says."""
    cl = resolve_cluster(cluster)
    check_fp8(fp8, cl)
    from sapp.capture.ir import OpGraph
    if progress is not None and not callable(progress):
        raise SappError(f"progress must be a callable taking one line of text, got {type(progress).__name__}")
    capture_s, cached = 0.0, False
    cons = Constraints.from_dict(constraints)         # refused before any capture
    from sapp.search.constraints import check_target_runtime
    check_target_runtime(cons.target, runtime)        # an engine profile is the target's own
    if global_batch is not None:
        Constraints.check_global_batch(global_batch)
    if isinstance(model, OpGraph):       # an already captured graph (bench, engines): nothing to build
        module, name, info = None, model.name or "graph", None
        graph = model if graph is None else graph
    elif cache and graph is None and isinstance(model, str) and example_inputs is None and loss_fn is None \
            and targets is None:
        module, name, info, graph, capture_s = capture_spec(model, model_args)
        cached = module is None
    else:
        module, name, info = resolve_model(model, model_args=model_args)
    gb = Constraints.check_global_batch(global_batch if global_batch is not None else default_global_batch(info, cl.devices))
    settings = CostSettings(precision=precision or cl.precision, runtime=runtime or "eager",
                            dropout_noise=not cl.fused_dropout, optimizer=optimizer or "adam", grad_fp32=bool(grad_fp32),
                            fp8=fp8 or "", recompute_modules=tuple(recompute_modules),
                            moe_a2a_overlap=bool(moe_a2a_overlap), delay_wgrad=bool(delay_wgrad))
    if graph is None:
        graph, capture_s = capture_graph(module, example_inputs, loss_fn, targets)
    if cons.placement:        # pins naming nothing, or weights that cannot leave the device: refused before pricing
        from sapp.placement.groups import parse_pins
        parse_pins(cons.placement, graph, None)
    t0 = time.perf_counter()

    def run(skip):
        # blocks the runnable check found cannot run split keep tp off them only (sapp/emit/runnable.py)
        gather = getattr(skip, "gather", None) or {}
        res = _joint(graph, cl, gb, cons, settings, progress, skip, fits, None if gather else caches, gather)
        check_prediction(res.step_time_s, res.mfu, fp8_ceiling(settings, cl))
        return build_plan(graph, cl, res, name=name, global_batch=gb, constraints=cons, settings=settings,
                          section=res.sapp_section, model_args=model_args), res
    # the emitter's pre-step checks on the candidate returned, the next best where it fails (sapp/emit/runnable.py)
    from sapp.emit.runnable import first_runnable
    plan, res = first_runnable(run, module, example_inputs, cons)
    search_s = time.perf_counter() - t0
    # wall times are printed, never stored in the plan (byte-identical files)
    plan._timing = {"capture_s": capture_s, "search_s": search_s,
                    **({"capture_cached": True} if cached else {})}
    if return_result:
        return plan, res
    return plan


def _joint(graph, cl, gb, cons, settings, progress, skip, fits=None, caches=None, gather=None):
    """The joint search's best result; its operator section (when SP is chosen) as `sapp_section`.
    `gather` ({tp: module patterns}): blocks kept replicated at that tp (search/tp_layout.gathering)."""
    from sapp.search.joint import joint_search
    search_fn = tp_search_fn(gather)
    # the tp level searched in the one form DTensor runs (sapp/search/tp_layout.py), priced as emitted
    res = joint_search(graph, cl, global_batch=gb, constraints=cons, settings=settings, progress=progress,
                       search_fn=search_fn, skip=skip, fits=fits, caches=caches)
    section = operator_section(graph, res.profile) if _sp_chosen(res) else None
    if cons.sp is None and section is not None and section[2].get("sp", {}).get("unsupported"):
        # SP is priced on the block template; on the whole graph a piece may have no place the emitter
        # can put it (an encoder-decoder's decoder gathering the encoder output): emit would refuse the
        # plan, so with sp free the search runs again without it (tp still shards its regions)
        import dataclasses
        try:
            res = joint_search(graph, cl, global_batch=gb, constraints=dataclasses.replace(cons, sp=False),
                               settings=settings, progress=progress, search_fn=search_fn, skip=skip, fits=fits,
                               caches=caches)
            section = None
        except SappError:
            pass                          # nothing else fits: the plan keeps SP and emit says why not
    res.sapp_section = section
    return res


def _sp_chosen(res) -> bool:
    """Whether the result runs sequence parallelism; its operator section's `sp.unsupported` (on the
    whole graph) then says whether the emitter can place every piece.  The section is built once and
    handed to build_plan."""
    cfg = res.config
    return bool(getattr(cfg, "sp", False) and cfg.tp > 1)


def tp_search_fn(gather=None):
    from sapp.search import tp_layout
    return tp_layout.gathering(gather) if gather else tp_layout.search_fn


# ---- evaluate -------------------------------------------------------------------------------------
def _score(graph, cl, gb, cons, settings, splits, cfg):
    """Price exactly the plan's configuration `cfg` with its own splits (sapp/search/joint/single.py)."""
    from sapp.search.joint.single import score_config
    allowed, res = score_config(graph, cl, gb, cons, settings, cfg, fixed_strategies=splits)
    if not allowed:
        raise PlanError(f"the plan's configuration ({cfg.describe()}) is not one this cluster, model and batch "
                        f"allow (degrees, micro-batches and schedule must divide evenly); fix the plan or "
                        f"regenerate it with `sapp search`")
    if res is None:
        raise PlanError(f"the plan's stages cannot be priced ({cfg.describe()}); regenerate it with `sapp search`")
    return res


def evaluate(model, cluster, plan, *, example_inputs=None, graph=None, loss_fn=None, targets=None,
             model_args=None) -> dict:
    """Re-score `plan` (loaded or hand-edited) with the cost model: predicted step time, memory per
    stage and whether it fits.  Refuses a plan made for another model (PlanError).  `model_args`: the
    settings of a model named by a string (search's; a plan records them as model.args)."""
    from sapp.cluster.trust import trust_note
    if not isinstance(plan, Plan):
        raise PlanError("evaluate needs a sapp.Plan (use sapp.Plan.load(path))")
    cl = resolve_cluster(cluster) if cluster is not None else Cluster.from_dict(plan["cluster"], where="plan's cluster section: ")
    if graph is None:
        module, name, _ = resolve_model(model, model_args=model_args)
        graph, _ = capture_graph(module, example_inputs, loss_fn, targets)
    else:                   # the graph given is the model's: nothing to build (a calibration prices it often)
        name = model if isinstance(model, str) else getattr(getattr(model, "sapp_spec", None), "name",
                                                                  type(model).__name__)
    plan.check_model(graph.fingerprint(), name)
    from sapp.plan.names import check_plan_names
    check_plan_names(plan, graph)       # a name the model lacks would be skipped, not priced
    if plan["devices"] != cl.devices:
        raise PlanError(f"plan is for {plan['devices']} devices but the cluster has {cl.devices}; "
                        f"search a plan for this cluster")
    cons = constraints_from_plan(plan, graph)
    st = plan._d.get("settings") or {}
    settings = CostSettings(precision=st.get("precision", cl.precision), optimizer=st.get("optimizer", "adam"),
                            grad_sync_overlap=st.get("grad_sync_overlap", 0.0), runtime=st.get("runtime", "eager"),
                            dropout_noise=not cl.fused_dropout, moe_imbalance=st.get("moe_imbalance", 1.0),
                            grad_fp32=st.get("grad_fp32", False), fp8=st.get("fp8", ""),
                            recompute_modules=tuple(st.get("recompute_modules") or ()),
                            moe_a2a_overlap=st.get("moe_a2a_overlap", False), delay_wgrad=st.get("delay_wgrad", False))
    check_fp8(settings.fp8, cl)
    gb = plan["model"].get("global_batch")
    if gb is None:
        raise PlanError("model.global_batch is missing; add it (samples per step) or regenerate the plan")
    gb = Constraints.check_global_batch(gb, "model.global_batch")
    cfg = _plan_config(plan, gb)
    if cfg.schedule == "interleaved" and too_long(cfg.pp, cfg.m, cfg.v):
        raise PlanError(f"pipeline: {too_long(cfg.pp, cfg.m, cfg.v)}")
    res = _score(graph, cl, gb, cons, settings, _plan_splits(plan, graph), cfg)
    check_prediction(res.step_time_s, res.mfu, fp8_ceiling(settings, cl))
    fits = res.peak_memory_bytes <= cl.usable_memory
    return {
        "step_time_s": res.step_time_s, "peak_memory_bytes": res.peak_memory_bytes, "mfu": res.mfu,
        "compute_s": res.compute_s, "comm_s": res.comm_s, "bubble_s": res.bubble_s, "host_s": res.host_s, "optimizer_s": res.optimizer_s, "comm_by_kind": res.comm_by_kind,
        "capacity_bytes": cl.usable_memory, "fits": fits, "memory": res.memory,
        "stages": [{"index": s.index, "blocks": len(s.blocks), "fwd_s": s.fwd_s, "bwd_s": s.bwd_s,
                    "memory_bytes": s.memory_bytes} for s in res.stages],
        "config": res.config.describe(),
        "notes": [n for n in (trust_note(cl),) if n],
    }


def reprice_as_run(model, plan) -> dict:
    """evaluate() of `plan` on its own cluster: what sapp.emit and `sapp run` hand the emitter to price a
    program that differs from its plan (allow_mismatch); the emitter sits below the api and cannot import it."""
    return evaluate(model, None, plan)
