"""sapp: auto-parallel strategy search for PyTorch.

    cluster = sapp.Cluster.parse("a100-80g:nodes=128")
    plan = sapp.search(sapp.models.get("gpt3-175b"), cluster, global_batch=1536)
    plan.save("plan.json"); sapp.evaluate(model, cluster, sapp.Plan.load("plan.json"))

Heavy modules (torch, ortools) load on first use, so `import sapp` stays fast."""
from .cluster import Cluster, PRESETS as CLUSTER_PRESETS
from .errors import (CaptureError, ClusterError, ConstraintError, InfeasibleError, PlanError,
                     SappError)
from .plan import Plan
from .version import __version__
__all__ = ["Cluster", "Plan", "search", "evaluate", "capture", "emit", "models", "Constraints",
           "SappError", "ClusterError", "CaptureError", "PlanError", "ConstraintError", "InfeasibleError"]


def search(model, cluster, *, global_batch=None, constraints=None, precision=None, runtime=None, fp8=None,
           model_args=None, example_inputs=None, loss_fn=None, targets=None, optimizer=None, grad_fp32=False,
           cache=False, progress=None, graph=None, return_result=False, fits=None, caches=None,
           recompute_modules=(), moe_a2a_overlap=False, delay_wgrad=False):
    """Find the fastest parallel plan that fits the cluster's memory.

    The model is captured (on the meta device: no weights are allocated) and every layout the
    constraints leave open is priced on the cost model; the fastest that fits is returned.

    Parameters
    ----------
    model : nn.Module, str or OpGraph
        A module, a zoo name (``sapp models`` lists them), ``"pkg.module:factory"``, an HF
        ``config.json`` path, or a graph captured before.
    cluster : Cluster or str
        A Cluster or a spec such as ``"a100-80g:nodes=4"`` (``sapp clusters`` lists the presets).
    global_batch : int, optional
        Samples per step; default the model's usual one.
    constraints : dict or Constraints, optional
        Pins: ``tp``, ``dp``, ``pp``, ``cp``, ``ep``, ``zero``, ``micro_batches``, ``schedule``,
        ``virtual_chunks``, ``sp``, ``recompute`` (a policy or ``{block pattern: policy}``), ``stages``
        (``{block: stage}``), ``placement`` (``{table pattern: "host"|"device", "optimizer": ...}``),
        ``target`` (an engine: only what it can state).  Pin all to score one configuration.
    precision : {"bf16-mixed", "fp16-mixed", "fp32"}, optional
        Default: the cluster's.
    runtime : str, optional
        Runtime profile priced: ``"eager"`` (default, what ``sapp run`` executes), ``"fused"``,
        ``"fused+tp-overlap"``, ``"torchtitan"`` ...
    fp8 : {"tensorwise", "tensorwise-tp", "delayed", "blockwise"}, optional
        FP8 linear layers in the blocks, at the cluster's FP8 rate (torchao's tensorwise converter;
        Transformer Engine's delayed and blockwise recipes, which run a MoE's expert GEMMs in FP8 too).
    recompute_modules : tuple of str, optional
        What selective recomputation recomputes, Megatron-Core's ``--recompute-modules`` names
        (``("core_attn", "mlp")``); empty (default) recomputes the attention core.
    moe_a2a_overlap, delay_wgrad : bool, optional
        Price Megatron-Core's ``--overlap-moe-expert-parallel-comm`` (MoE all-to-alls hidden behind the
        paired micro-batch's compute) and ``--delay-wgrad-compute``; ``sapp run`` does not run them.
    model_args : dict, optional
        Settings of a model named by a string (``{"seq": 8192}``, a zoo config key, an HF field);
        the plan records them so ``sapp run`` builds the same model.
    example_inputs, loss_fn, targets, optimizer, grad_fp32, cache, progress, graph, return_result, fits, caches
        As in :func:`sapp.api.search`, which documents each.

    Returns
    -------
    Plan
        The layout, its per-stage prediction and notes; ``plan.save(path)`` writes it.

    Raises
    ------
    InfeasibleError
        Nothing fits; the message says what would.
    ConstraintError
        Contradictory or unknown pins.

    Examples
    --------
    >>> import sapp
    >>> plan = sapp.search("gpt-tiny", "cpu:nodes=1", global_batch=16, constraints={"dp": 2})
    >>> plan["parallel"]["dp"], plan["predicted"]["step_time_s"] > 0
    (2, True)
    """
    from .api import search as _search
    return _search(model, cluster, global_batch=global_batch, constraints=constraints, precision=precision,
                   runtime=runtime, fp8=fp8, model_args=model_args, example_inputs=example_inputs, loss_fn=loss_fn,
                   targets=targets, optimizer=optimizer, grad_fp32=grad_fp32, cache=cache, progress=progress,
                   graph=graph, return_result=return_result, fits=fits, caches=caches,
                   recompute_modules=recompute_modules, moe_a2a_overlap=moe_a2a_overlap, delay_wgrad=delay_wgrad)


def evaluate(model, cluster, plan, *, example_inputs=None, graph=None, loss_fn=None, targets=None,
             model_args=None):
    """Re-score a plan (loaded, hand-edited or searched) on the cost model.

    Parameters
    ----------
    model : nn.Module, str or OpGraph
        The model the plan was made for, as :func:`search` takes it.
    cluster : Cluster, str or None
        The cluster to price on; None: the plan's own cluster section.
    plan : Plan
        ``sapp.Plan.load(path)`` or a plan :func:`search` returned.
    example_inputs, loss_fn, targets : optional
        As in :func:`search`, for a module that is not a zoo model.
    graph : OpGraph, optional
        The model captured before (nothing is built then).
    model_args : dict, optional
        Settings of a model named by a string, as in :func:`search`.

    Returns
    -------
    dict
        ``step_time_s``, ``peak_memory_bytes``, ``mfu``, ``compute_s``, ``comm_s``, ``bubble_s``,
        ``fits``, ``memory``, ``stages``, ``notes``, ...

    Raises
    ------
    PlanError
        The plan was made for another model or another number of devices.

    Examples
    --------
    >>> import sapp
    >>> plan = sapp.search("gpt-tiny", "cpu:nodes=1", global_batch=16, constraints={"dp": 2})
    >>> report = sapp.evaluate("gpt-tiny", "cpu:nodes=1", plan)
    >>> report["fits"], abs(report["step_time_s"] / plan["predicted"]["step_time_s"] - 1) < 1e-5
    (True, True)
    """
    from .api import evaluate as _evaluate
    return _evaluate(model, cluster, plan, example_inputs=example_inputs, graph=graph, loss_fn=loss_fn,
                     targets=targets, model_args=model_args)


def capture(model, example_inputs=None, *, target=None, loss_fn=None, batch=None, name=None, fast=None,
            method="auto"):
    """Trace a model into the operator graph the search prices (on the meta device: no weights).

    Parameters
    ----------
    model : nn.Module
        A module; a zoo model (``sapp.models.get(name)``) brings its own inputs, targets and loss.
    example_inputs : Tensor or tuple, optional
        One batch matching ``forward(...)``; needed for a module that is not a zoo model.
    target, loss_fn : optional
        ``loss_fn(output, target)`` is captured as part of the graph.
    batch : int, optional
        A zoo model's capture batch (default 8).
    name : str, optional
        The graph's name.
    fast : bool, optional
        None: a deep stack of identical blocks is traced once and replicated; True forces, False
        disables it.
    method : {"auto", "export", "fx"}
        ``torch.export`` with the torch.fx fallback, or one of them.

    Returns
    -------
    OpGraph

    Raises
    ------
    CaptureError
        The model cannot be traced; the message says what to pass or change.

    Examples
    --------
    >>> import sapp
    >>> graph = sapp.capture(sapp.models.get("gpt-tiny"))
    >>> graph.batch_size, "matmul" in {node.kind for node in graph.nodes.values()}
    (8, True)
    """
    from .capture import capture as _capture
    return _capture(model, example_inputs, target=target, loss_fn=loss_fn, batch=batch, name=name, fast=fast,
                    method=method)


def emit(model, plan, **kwargs):
    """Build this rank's training program for a plan (what each rank of ``sapp run`` runs).

    Parameters
    ----------
    model : nn.Module
        The model with real weights, e.g. ``sapp.models.get(name, device="cpu")``.
    plan : Plan
        A plan for this model; with more than one device the process group must be up
        (``sapp run`` / torchrun start it).
    **kwargs
        ``loss_fn``, ``lr``, ``optimizer``, ``device``, ``example_inputs``, ``name``,
        ``allow_mismatch``, ...: as in :func:`sapp.emit.recipe.emit`, which documents each.

    Returns
    -------
    Program
        ``program.step(inputs, targets)`` trains one step and returns the loss.

    Raises
    ------
    PlanError
        The plan does not fit this model, or what would run differs from what was priced.

    Examples
    --------
    >>> import sapp, torch
    >>> plan = sapp.search("gpt-tiny", "cpu:gpus=1", global_batch=4)
    >>> program = sapp.emit(sapp.models.get("gpt-tiny", device="cpu"), plan, name="gpt-tiny")
    >>> tokens = torch.randint(0, 256, (4, 32))
    >>> loss = program.step(tokens, tokens)
    >>> isinstance(loss, float) and loss > 0
    True
    """
    from .api import reprice_as_run
    from .emit import emit as _emit
    kwargs.setdefault("reprice", reprice_as_run)      # an allowed mismatch is re-priced through it
    return _emit(model, plan, **kwargs)


_emit = emit      # what the callable sapp.emit package forwards to (the name `emit` is rebound to the package)
# the facade's functions by name, whatever their names are rebound to: doctest reads its examples from
# here (tests/test_api_doctests.py), and help() of a callable package shows its function's
__test__ = {"search": search, "evaluate": evaluate, "capture": capture, "emit": emit}


def __getattr__(name):
    # importlib, not `from . import x`: the latter asks this very __getattr__ again and recurses.
    import importlib
    if name == "models":
        return importlib.import_module("sapp.models")
    if name == "Constraints":
        return importlib.import_module("sapp.search.constraints").Constraints
    raise AttributeError(f"module 'sapp' has no attribute {name!r}")


# `sapp.search`, `sapp.emit` and `sapp.capture` are both user functions and subpackages.  Importing a
# subpackage makes Python rebind the parent's attribute to it, which would hide the function; instead
# the subpackage is made callable (forwarding to the entry point), so `sapp.search(model, cluster)` and
# `from sapp.search import shard_search` both keep working in any import order.
import importlib as _importlib
import inspect as _inspect
import sys as _sys
import types as _types

_ENTRIES = {"sapp.search": ("sapp.api", "search"), "sapp.emit": ("sapp", "_emit"),
            "sapp.capture": ("sapp.capture", "capture")}


class _CallablePackage(_types.ModuleType):
    def __call__(self, *args, **kwargs):
        module, name = _ENTRIES[self.__name__]
        return getattr(_importlib.import_module(module), name)(*args, **kwargs)


class _SappModule(_types.ModuleType):
    def __setattr__(self, name, value):
        if type(value) is _types.ModuleType and getattr(value, "__name__", None) in _ENTRIES:
            value.__class__ = _CallablePackage
            fn = __test__[value.__name__[len("sapp."):]]     # help(sapp.search) still shows the function's
            value.__signature__ = _inspect.signature(fn)
            value.__doc__ = f"{fn.__doc__}\n(the package {value.__name__}: {value.__doc__ or ''})"
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _SappModule
