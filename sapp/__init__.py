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
           cache=False, progress=None, graph=None, return_result=False, fits=None, caches=None):
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
    fp8 : {"tensorwise", "delayed"}, optional
        FP8 linear layers in the blocks, at the cluster's FP8 rate.
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
                   graph=graph, return_result=return_result, fits=fits, caches=caches)


def evaluate(model, cluster, plan, **kwargs):
    from .api import evaluate as _evaluate
    return _evaluate(model, cluster, plan, **kwargs)


def capture(model, example_inputs=None, **kwargs):
    from .capture import capture as _capture
    return _capture(model, example_inputs, **kwargs)


def emit(model, plan, **kwargs):
    from .api import reprice_as_run
    from .emit import emit as _emit
    kwargs.setdefault("reprice", reprice_as_run)      # an allowed mismatch is re-priced through it
    return _emit(model, plan, **kwargs)


_emit = emit      # what the callable sapp.emit package forwards to (the name `emit` is rebound to the package)


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
            if value.__name__ == "sapp.search":     # help(sapp.search) still shows the function's
                value.__signature__ = _inspect.signature(search)
                value.__doc__ = f"{search.__doc__}\n(the package sapp.search: {value.__doc__ or ''})"
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _SappModule
